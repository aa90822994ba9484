//! The fused row nodes of a dense layer (`mlx_core::row_layer`): the composed MLX form's values,
//! and every row's bits independent of how many rows are computed together.

use mlx_core::fast::RopeFreqs;
use mlx_core::row_layer::{self, FfnWeights, PerLayerTail, QkvRows, QkvWeights, RowWeight};
use mlx_core::{fast, gelu_approx, random, Array, Dtype, Error};

type R = Result<(), Error>;

const H: i32 = 48; // hidden, not a multiple of 32: exercises the kernels' tails
const D: i32 = 16; // head_dim
const HQ: i32 = 3;
const HKV: i32 = 1;
const F: i32 = 136; // MLP width
const EPS: f32 = 1e-6;
const BASE: f32 = 10000.0;

fn normal(shape: &[i32], seed: u64, scale: f32) -> Array {
    let key = random::key(seed).unwrap();
    random::normal(shape, Dtype::F32, 0.0, scale, &key).unwrap()
}

fn max_abs_diff(a: &Array, b: &Array) -> f32 {
    let (a, b) = (a.to_f32_vec().unwrap(), b.to_f32_vec().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn bits(a: &Array) -> Vec<u32> {
    a.to_f32_vec().unwrap().iter().map(|v| v.to_bits()).collect()
}

struct Layer {
    in_norm: Array,
    wq: Array,
    q_norm: Array,
    wk: Array,
    k_norm: Array,
    wv: Array,
    wo: Array,
    post_attn: Array,
    pre_ff: Array,
    wg: Array,
    wu: Array,
    wd: Array,
    post_ff: Array,
    scalar: Array,
    inv_freqs: Array,
}

fn layer() -> Layer {
    Layer {
        in_norm: normal(&[H], 1, 0.5).add_scalar(1.0).unwrap(),
        wq: normal(&[HQ * D, H], 2, 0.2),
        q_norm: normal(&[D], 3, 0.5).add_scalar(1.0).unwrap(),
        wk: normal(&[HKV * D, H], 4, 0.2),
        k_norm: normal(&[D], 5, 0.5).add_scalar(1.0).unwrap(),
        wv: normal(&[HKV * D, H], 6, 0.2),
        wo: normal(&[H, HQ * D], 7, 0.2),
        post_attn: normal(&[H], 8, 0.5).add_scalar(1.0).unwrap(),
        pre_ff: normal(&[H], 9, 0.5).add_scalar(1.0).unwrap(),
        wg: normal(&[F, H], 10, 0.2),
        wu: normal(&[F, H], 11, 0.2),
        wd: normal(&[H, F], 12, 0.2),
        post_ff: normal(&[H], 13, 0.5).add_scalar(1.0).unwrap(),
        scalar: Array::from_slice(&[0.75f32], &[1]).unwrap(),
        inv_freqs: {
            let inv: Vec<f32> =
                (0..D / 2).map(|i| (BASE as f64).powf(-2.0 * f64::from(i) / f64::from(D)) as f32).collect();
            Array::from_slice(&inv, &[D / 2]).unwrap()
        },
    }
}

impl Layer {
    fn qkv_weights(&self) -> QkvWeights<'_> {
        QkvWeights {
            input_norm: &self.in_norm,
            wq: RowWeight::Dense(&self.wq),
            q_norm: &self.q_norm,
            wk: RowWeight::Dense(&self.wk),
            k_norm: &self.k_norm,
            wv: RowWeight::Dense(&self.wv),
            inv_freqs: &self.inv_freqs,
            head_dim: D as usize,
        }
    }

    /// q, k, v of `x` // `[B·L, H]` at positions `offset..offset + L`
    fn qkv(&self, x: &Array, batch: usize, offset: i32) -> (Array, Array, Array) {
        let l = x.dim(0).unwrap() / batch as i32;
        let positions: Vec<i32> = (offset..offset + l).collect();
        let positions = Array::from_slice(&positions, &[l]).unwrap();
        row_layer::qkv(&QkvRows { x, batch, positions: &positions }, &self.qkv_weights(), EPS).unwrap()
    }

    fn ffn_weights(&self) -> FfnWeights<'_> {
        FfnWeights {
            wo: RowWeight::Dense(&self.wo),
            post_attention_norm: &self.post_attn,
            pre_feedforward_norm: &self.pre_ff,
            w_gate: RowWeight::Dense(&self.wg),
            w_up: RowWeight::Dense(&self.wu),
            w_down: RowWeight::Dense(&self.wd),
            post_feedforward_norm: &self.post_ff,
            layer_scalar: &self.scalar,
            per_layer: None,
        }
    }
}

/// x [R, H] @ wᵀ through MLX's matmul (the BLAS), the composed reference.
fn lin(x: &Array, w: &Array) -> Array {
    x.matmul(&w.transpose(&[1, 0]).unwrap()).unwrap()
}

/// Per-head RMS norm of [B·L, heads·D] rows, then RoPE from `offset` (if any), composed, in
/// the [B, heads, L, D] layout.
fn heads(x: &Array, batch: i32, heads: i32, w: Option<&Array>, rope_from: Option<i32>) -> Array {
    let l = x.dim(0).unwrap() / batch;
    let normed = fast::rms_norm(&x.reshape(&[batch, l, heads, D]).unwrap(), w, EPS).unwrap();
    let t = normed.transpose(&[0, 2, 1, 3]).unwrap();
    match rope_from {
        Some(o) => fast::rope(&t, D, false, RopeFreqs::Base(BASE), 1.0, o).unwrap(),
        None => t,
    }
}

#[test]
fn qkv_is_the_composed_chain() -> R {
    let l = layer();
    for (batch, rows, offset) in [(1, 5, 0), (1, 3, 117), (2, 8, 9)] {
        let x = normal(&[rows, H], 20 + rows as u64, 1.0);
        let (q, k, v) = l.qkv(&x, batch as usize, offset);
        let xn = fast::rms_norm(&x, Some(&l.in_norm), EPS)?;
        assert_eq!(q.shape()?, vec![batch, HQ, rows / batch, D]);
        assert_eq!(k.shape()?, vec![batch, HKV, rows / batch, D]);
        let dq = max_abs_diff(&q, &heads(&lin(&xn, &l.wq), batch, HQ, Some(&l.q_norm), Some(offset)));
        let dk = max_abs_diff(&k, &heads(&lin(&xn, &l.wk), batch, HKV, Some(&l.k_norm), Some(offset)));
        let dv = max_abs_diff(&v, &heads(&lin(&xn, &l.wv), batch, HKV, None, None));
        assert!(dq < 1e-4 && dk < 1e-4 && dv < 1e-4, "B={batch} offset {offset}: q {dq}, k {dk}, v {dv}");
    }
    Ok(())
}

#[test]
fn ffn_is_the_composed_chain() -> R {
    let l = layer();
    let (a, x) = (normal(&[4, HQ * D], 21, 1.0), normal(&[4, H], 22, 1.0));
    let out = row_layer::ffn(&a, &x, &l.ffn_weights(), EPS)?;
    let h = x.add(&fast::rms_norm(&lin(&a, &l.wo), Some(&l.post_attn), EPS)?)?;
    let t = fast::rms_norm(&h, Some(&l.pre_ff), EPS)?;
    let m = gelu_approx(&lin(&t, &l.wg))?.multiply(&lin(&t, &l.wu))?;
    let want = h.add(&fast::rms_norm(&lin(&m, &l.wd), Some(&l.post_ff), EPS)?)?.multiply(&l.scalar)?;
    assert_eq!(out.shape()?, vec![4, H]);
    let diff = max_abs_diff(&out, &want);
    assert!(diff < 1e-4, "fused tail differs from the composed chain by {diff}");
    Ok(())
}

/// With Gemma-4's per-layer input branch (PLE) the tail also gates the per-layer input and adds
/// its normed projection before the layer scalar; each row is still its own.
#[test]
fn ffn_with_a_per_layer_input_is_the_composed_chain() -> R {
    const P: i32 = 40;
    let l = layer();
    let (a, x, pli) = (normal(&[6, HQ * D], 23, 1.0), normal(&[6, H], 24, 1.0), normal(&[6, P], 25, 1.0));
    let (wpg, wpp, post) = (normal(&[P, H], 26, 0.2), normal(&[H, P], 27, 0.2), normal(&[H], 28, 0.5).add_scalar(1.0)?);
    let tail = |input: &Array| {
        let per_layer = Some(PerLayerTail {
            input: &input.clone(),
            gate: RowWeight::Dense(&wpg),
            projection: RowWeight::Dense(&wpp),
            post_norm: &post,
        });
        // PerLayerTail borrows: build the node here and hand back its output.
        row_layer::ffn(
            &a.slice_axis(0, 0, input.dim(0).unwrap()).unwrap(),
            &x.slice_axis(0, 0, input.dim(0).unwrap()).unwrap(),
            &FfnWeights { per_layer, ..l.ffn_weights() },
            EPS,
        )
    };
    let out = tail(&pli)?;
    let h = x.add(&fast::rms_norm(&lin(&a, &l.wo), Some(&l.post_attn), EPS)?)?;
    let t = fast::rms_norm(&h, Some(&l.pre_ff), EPS)?;
    let m = gelu_approx(&lin(&t, &l.wg))?.multiply(&lin(&t, &l.wu))?;
    let h = h.add(&fast::rms_norm(&lin(&m, &l.wd), Some(&l.post_ff), EPS)?)?;
    let g = gelu_approx(&lin(&h, &wpg))?.multiply(&pli)?;
    let want = h.add(&fast::rms_norm(&lin(&g, &wpp), Some(&post), EPS)?)?.multiply(&l.scalar)?;
    let diff = max_abs_diff(&out, &want);
    assert!(diff < 1e-4, "fused tail with PLE differs from the composed chain by {diff}");
    let first = tail(&pli.slice_axis(0, 0, 1)?)?;
    assert_eq!(bits(&first), bits(&out.slice_axis(0, 0, 1)?), "row 0 alone");
    let bad = PerLayerTail {
        input: &pli,
        gate: RowWeight::Dense(&wpp),
        projection: RowWeight::Dense(&wpp),
        post_norm: &post,
    };
    let err = row_layer::ffn(&a, &x, &FfnWeights { per_layer: Some(bad), ..l.ffn_weights() }, EPS).unwrap_err();
    assert!(err.to_string().contains("per-layer input gate"), "{err}");
    Ok(())
}

#[test]
fn every_row_is_its_own_whatever_the_batch() -> R {
    let l = layer();
    let n = 19;
    let x = normal(&[n, H], 30, 1.0);
    let a = normal(&[n, HQ * D], 31, 1.0);
    let (q, k, v) = l.qkv(&x, 1, 40);
    let out = row_layer::ffn(&a, &x, &l.ffn_weights(), EPS)?;
    for i in [0, 7, n - 1] {
        let xi = x.slice_axis(0, i, i + 1)?;
        let ai = a.slice_axis(0, i, i + 1)?;
        let (qi, ki, vi) = l.qkv(&xi, 1, 40 + i);
        assert_eq!(bits(&qi), bits(&q.slice_axis(2, i, i + 1)?), "q row {i}");
        assert_eq!(bits(&ki), bits(&k.slice_axis(2, i, i + 1)?), "k row {i}");
        assert_eq!(bits(&vi), bits(&v.slice_axis(2, i, i + 1)?), "v row {i}");
        let oi = row_layer::ffn(&ai, &xi, &l.ffn_weights(), EPS)?;
        assert_eq!(bits(&oi), bits(&out.slice_axis(0, i, i + 1)?), "ffn row {i}");
    }
    // Strided inputs (a transposed view) are read as their values, not their buffer.
    let xt = x.transpose(&[1, 0])?.transpose(&[1, 0])?;
    let strided = normal(&[H, n], 32, 1.0).transpose(&[1, 0])?; // [n, H], column-major
    let (qs, _, _) = l.qkv(&strided, 1, 40);
    let (qc, _, _) = l.qkv(&strided.add_scalar(0.0)?.reshape(&[n, H])?, 1, 40);
    assert_eq!(bits(&qs), bits(&qc));
    assert_eq!(bits(&l.qkv(&xt, 1, 40).0), bits(&q));
    Ok(())
}

#[test]
fn mismatched_inputs_are_refused_by_name() {
    let l = layer();
    let x = normal(&[2, H], 40, 1.0);
    let positions = Array::from_slice(&[0i32, 1], &[2]).unwrap();
    let rows = QkvRows { x: &x, batch: 1, positions: &positions };
    let bad = QkvWeights { wv: RowWeight::Dense(&l.wo), ..l.qkv_weights() };
    let err = row_layer::qkv(&rows, &bad, EPS).unwrap_err();
    assert!(err.to_string().contains("row_qkv"), "{err}");
    let float_positions = positions.astype(Dtype::F32).unwrap();
    let err = row_layer::qkv(&QkvRows { positions: &float_positions, ..rows }, &l.qkv_weights(), EPS).unwrap_err();
    assert!(err.to_string().contains("int32"), "{err}");
    let bf = x.astype(Dtype::Bf16).unwrap();
    let err = row_layer::ffn(&normal(&[2, HQ * D], 41, 1.0), &bf, &l.ffn_weights(), EPS).unwrap_err();
    assert!(err.to_string().contains("not float32"), "{err}");
}

/// The row RMS norm reads strided inputs (a transposed view of per-head rows) as their values,
/// and broadcasts its weight over every row, as MLX's form does.
#[test]
fn row_rms_norm_reads_strided_rows() -> R {
    let x = normal(&[2, 5, 3, 8], 50, 1.0);
    let w = normal(&[8], 51, 0.5).add_scalar(1.0)?;
    for view in [x.transpose(&[0, 2, 1, 3])?, x.transpose(&[2, 0, 1, 3])?, x.slice_axis(1, 1, 4)?] {
        let ours = row_layer::rms_norm(&view, Some(&w), EPS)?;
        let want = fast::rms_norm(&view, Some(&w), EPS)?;
        assert_eq!(ours.shape()?, want.shape()?);
        let diff = max_abs_diff(&ours, &want);
        assert!(diff < 1e-5, "strided view {:?}: differs from MLX's rms_norm by {diff}", view.shape()?);
    }
    Ok(())
}

/// The pre-norm nodes (DSpark's backbone layer) compute exactly the chain the drafter composes
/// from single row nodes (row RMS norm, row products, row GELU): the same bits, so fusing them
/// changes no draft. Each row is its own whatever the batch, and bad shapes are refused by name.
#[test]
fn prenorm_nodes_are_the_composed_row_chain_bit_for_bit() -> R {
    use mlx_core::blas::{row_gelu, row_linear};
    let l = layer();
    let (n, batch) = (6, 2);
    let x = normal(&[n, H], 60, 1.0);
    let outs = row_layer::normed_heads(
        &x,
        batch,
        &l.in_norm,
        &[RowWeight::Dense(&l.wq), RowWeight::Dense(&l.wk)],
        D as usize,
        EPS,
    )?;
    let xn = row_layer::rms_norm(&x, Some(&l.in_norm), EPS)?;
    let by_head = |t: Array, heads: i32| {
        t.reshape(&[batch as i32, n / batch as i32, heads, D]).unwrap().transpose(&[0, 2, 1, 3]).unwrap()
    };
    assert_eq!(outs.len(), 2);
    assert_eq!(outs[0].shape()?, vec![batch as i32, HQ, n / batch as i32, D]);
    assert_eq!(bits(&outs[0]), bits(&by_head(row_linear(&xn, &l.wq)?, HQ)));
    assert_eq!(bits(&outs[1]), bits(&by_head(row_linear(&xn, &l.wk)?, HKV)));

    let a = normal(&[n, HQ * D], 61, 1.0);
    let w = row_layer::PreNormFfnWeights {
        wo: RowWeight::Dense(&l.wo),
        ff_norm: &l.pre_ff,
        w_gate: RowWeight::Dense(&l.wg),
        w_up: RowWeight::Dense(&l.wu),
        w_down: RowWeight::Dense(&l.wd),
    };
    let out = row_layer::prenorm_ffn(&a, &x, &w, EPS)?;
    let h = x.add(&row_linear(&a, &l.wo)?)?;
    let t = row_layer::rms_norm(&h, Some(&l.pre_ff), EPS)?;
    let m = row_gelu(&row_linear(&t, &l.wg)?)?.multiply(&row_linear(&t, &l.wu)?)?;
    assert_eq!(bits(&out), bits(&h.add(&row_linear(&m, &l.wd)?)?));
    for i in [0, n - 1] {
        let (xi, ai) = (x.slice_axis(0, i, i + 1)?, a.slice_axis(0, i, i + 1)?);
        assert_eq!(bits(&row_layer::prenorm_ffn(&ai, &xi, &w, EPS)?), bits(&out.slice_axis(0, i, i + 1)?), "row {i}");
        let qi = row_layer::normed_heads(&xi, 1, &l.in_norm, &[RowWeight::Dense(&l.wq)], D as usize, EPS)?;
        let (b, r) = (i / (n / batch as i32), i % (n / batch as i32));
        let want = outs[0].slice_axis(0, b, b + 1)?.slice_axis(2, r, r + 1)?;
        assert_eq!(bits(&qi[0]), bits(&want), "q row {i}");
    }
    let err = row_layer::normed_heads(&x, 1, &l.in_norm, &[RowWeight::Dense(&l.wd)], D as usize, EPS).unwrap_err();
    assert!(err.to_string().contains("row_normed_heads"), "{err}");
    let err =
        row_layer::prenorm_ffn(&a, &x, &row_layer::PreNormFfnWeights { w_down: RowWeight::Dense(&l.wg), ..w }, EPS)
            .unwrap_err();
    assert!(err.to_string().contains("down weight"), "{err}");
    Ok(())
}
