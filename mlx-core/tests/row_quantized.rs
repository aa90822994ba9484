//! The packed 8/4-bit row kernel: its rows are `row_linear` on the matrix dequantized with
//! `fma(q, scale, bias)` bit for bit (4-bit matrices with K a multiple of 128: the integer path's
//! host reference, 8-bit activations), whatever the number of rows; it reads MLX's packing (it
//! agrees with MLX's quantized matmul); its vector forms give the portable form's bits.

use mlx_core::quant::{self, QuantSpec, Quantized};
use mlx_core::row_layer::{self, FfnWeights, QkvRows, QkvWeights, RowWeight};
use mlx_core::{random, Array, Dtype};

fn f32s(a: &Array) -> Vec<f32> {
    a.to_f32_vec().unwrap()
}

/// The packed matrix dequantized on the host the way the kernel does it: one fma per weight.
fn fma_dequantized(q: &Quantized, n: usize, k: usize) -> Array {
    let (bits, group) = (q.spec.bits() as usize, q.spec.group_size() as usize);
    let bytes = q.weight.to_bytes().unwrap(); // uint32 words, little-endian: the packed bytes
    let (s, b) = (f32s(&q.scales), f32s(&q.biases));
    let groups = k / group;
    let mut dense = vec![0f32; n * k];
    for i in 0..n {
        let row = &bytes[i * k * bits / 8..(i + 1) * k * bits / 8];
        for j in 0..k {
            let v = match bits {
                8 => row[j],
                _ if j % 2 == 0 => row[j / 2] & 15,
                _ => row[j / 2] >> 4,
            };
            let g = i * groups + j / group;
            dense[i * k + j] = f32::from(v).mul_add(s[g], b[g]);
        }
    }
    Array::from_slice(&dense, &[n as i32, k as i32]).unwrap()
}

/// The 4-bit integer path computed on the host from its contract (row_nibble_dot.cc): each row
/// of x quantized to 8 bits per 32 inputs (max|x| / 127, ties to even), per 128-input chunk
/// sixteen lanes of eight inputs each: the exact integer sum, then fma(isum, s·sx, acc) and
/// fma(b, sx·Σq, acc) in f32 (Σq the lane's rounded inputs), and the lanes' fixed tree.
fn int8_reference(x: &Array, q: &Quantized, n: usize, k: usize) -> Array {
    let xs = f32s(x);
    let m = xs.len() / k;
    let bytes = q.weight.to_bytes().unwrap();
    let (s, b) = (f32s(&q.scales), f32s(&q.biases));
    let group = q.spec.group_size() as usize;
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        let xr = &xs[r * k..(r + 1) * k];
        let mut xq = vec![0i32; k];
        let mut sx = vec![0f32; k / 32];
        for blk in 0..k / 32 {
            let amax = xr[blk * 32..blk * 32 + 32].iter().fold(0f32, |a, v| a.max(v.abs()));
            sx[blk] = amax / 127.0;
            let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            for j in blk * 32..blk * 32 + 32 {
                xq[j] = (xr[j] * inv).round_ties_even().clamp(-127.0, 127.0) as i32;
            }
        }
        for col in 0..n {
            let row = &bytes[col * k / 2..(col + 1) * k / 2];
            let mut acc = [0f32; 16];
            for c in 0..k / 128 {
                for (i, a) in acc.iter_mut().enumerate() {
                    let k0 = c * 128 + 8 * i;
                    let (mut isum, mut qsum) = (0i32, 0i32);
                    for j in 0..8 {
                        let nibble = if (k0 + j) % 2 == 0 { row[(k0 + j) / 2] & 15 } else { row[(k0 + j) / 2] >> 4 };
                        isum += i32::from(nibble) * xq[k0 + j];
                        qsum += xq[k0 + j];
                    }
                    let (g, scale) = (col * (k / group) + k0 / group, sx[k0 / 32]);
                    *a = (isum as f32).mul_add(s[g] * scale, *a);
                    *a = b[g].mul_add(qsum as f32 * scale, *a);
                }
            }
            let t: Vec<f32> = (0..8).map(|i| acc[i] + acc[i + 8]).collect();
            y[r * n + col] = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
        }
    }
    Array::from_slice(&y, &[m as i32, n as i32]).unwrap()
}

#[test]
fn packed_rows_are_their_reference_bit_for_bit() {
    let cases =
        [(8, 64, 256, 12), (4, 64, 256, 12), (8, 32, 96, 5), (4, 128, 384, 9), (4, 32, 1024, 21), (4, 32, 96, 7)];
    for (bits, group, k, n) in cases {
        let spec = QuantSpec::new(bits, group).unwrap();
        let key = random::key(u64::from(bits * 1000 + group) + k as u64).unwrap();
        let w = random::normal(&[n as i32, k as i32], Dtype::F32, 0.0, 0.05, &key).unwrap(); // [N, K]
        let x = random::normal(&[40, k as i32], Dtype::F32, 0.0, 1.0, &random::key(3).unwrap()).unwrap();
        let q = quant::quantize(&w, spec).unwrap();
        assert_eq!(q.scales.dtype(), Dtype::F32);
        assert!(q.row_readable());
        let all = quant::row_quantized_linear(&x, &q).unwrap(); // [40, N]
        let int8 = quant::int8_activations(k, bits);
        assert_eq!(int8, bits == 4 && k % 128 == 0 && std::env::var_os("MLX_CORE_Q4_F32").is_none());
        let want = match int8 {
            true => int8_reference(&x, &q, n, k),
            false => mlx_core::blas::row_linear(&x, &fma_dequantized(&q, n, k)).unwrap(),
        };
        let case = format!("{bits}-bit, group {group}, [40, {k}] x [{n}, {k}]");
        assert_eq!(all.to_bytes().unwrap(), want.to_bytes().unwrap(), "{case}: differs from its reference");
        // MLX's own quantized matmul reads the same packing (its sums in another order, its
        // activations in f32: the integer path's 8-bit activations cost ~1/254 of a block's
        // largest input per input).
        let reference = quant::quantized_matmul(&x, &q.weight, &q.scales, &q.biases, true, spec).unwrap();
        let max = f32s(&all).iter().zip(f32s(&reference)).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let tol = if int8 { 1.5e-3 } else { 1e-4 } * (k as f32).sqrt();
        assert!(max < tol, "{case}: differs from MLX's quantized matmul by {max}");
        for (start, rows) in [(0, 1), (5, 1), (3, 2), (2, 3), (7, 5), (9, 7), (0, 8), (11, 9), (20, 17)] {
            let part = quant::row_quantized_linear(&x.slice_axis(0, start, start + rows).unwrap(), &q).unwrap();
            let want = all.slice_axis(0, start, start + rows).unwrap();
            assert_eq!(part.to_bytes().unwrap(), want.to_bytes().unwrap(), "{case}: rows {start}..+{rows}");
        }
        for m in [1, 2, 3, 5, 8, 9, 17] {
            assert!(quant::row_quantized_paths_agree(m, k, n, spec), "{case}: vector forms differ at {m} rows");
        }
    }
}

/// `Quantized::matmul_t` on the CPU: few rows through the packed kernel, many through the BLAS on
/// the dequantized matrix; both close to MLX's quantized matmul.
#[test]
fn quantized_matmul_picks_the_row_kernel_for_few_rows() {
    let spec = QuantSpec::new(4, 64).unwrap();
    let w = random::normal(&[24, 128], Dtype::F32, 0.0, 0.05, &random::key(9).unwrap()).unwrap();
    let q = quant::quantize(&w, spec).unwrap();
    for rows in [1, 7, 64, 65, 130] {
        let x = random::normal(&[rows, 128], Dtype::F32, 0.0, 1.0, &random::key(rows as u64).unwrap()).unwrap();
        let got = q.matmul_t(&x).unwrap();
        let reference = quant::quantized_matmul(&x, &q.weight, &q.scales, &q.biases, true, spec).unwrap();
        assert_eq!(got.shape().unwrap(), vec![rows, 24]);
        let max = f32s(&got).iter().zip(f32s(&reference)).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let row_kernel = rows <= 64 && mlx_core::blas::row_linear_enabled();
        let tol = if row_kernel && quant::int8_activations(128, 4) { 0.03 } else { 1e-3 };
        assert!(max < tol, "{rows} rows: differs from MLX's quantized matmul by {max}");
        if row_kernel {
            let packed = quant::row_quantized_linear(&x, &q).unwrap();
            assert_eq!(got.to_bytes().unwrap(), packed.to_bytes().unwrap(), "{rows} rows: not the row kernel");
        }
    }
}

/// The fused layer nodes read packed matrices as the packed kernel does: their outputs are those
/// of the same nodes on the fma-dequantized dense matrices, bit for bit, and mixed forms work
/// (every K here is under 128, so 4-bit matrices take the f32 path too; the integer path's nodes
/// are `fused_nodes_on_the_integer_path_keep_rows_their_own`).
#[test]
fn fused_nodes_read_packed_matrices() {
    let (h, d, hq, f) = (64usize, 32usize, 2usize, 96usize);
    let w = |n: usize, k: usize, seed: u64| {
        random::normal(&[n as i32, k as i32], Dtype::F32, 0.0, 0.1, &random::key(seed).unwrap()).unwrap()
    };
    let ones = |n: usize| Array::ones(&[n as i32], Dtype::F32).unwrap();
    let inv: Vec<f32> = (0..d / 2).map(|i| 10000f32.powf(-2.0 * i as f32 / d as f32)).collect();
    let inv = Array::from_slice(&inv, &[d as i32 / 2]).unwrap();
    let x = random::normal(&[5, h as i32], Dtype::F32, 0.0, 1.0, &random::key(77).unwrap()).unwrap();
    let positions = Array::from_slice(&[3i32, 4, 5, 6, 7], &[5]).unwrap();
    let rows = QkvRows { x: &x, batch: 1, positions: &positions };
    let a = random::normal(&[5, (hq * d) as i32], Dtype::F32, 0.0, 1.0, &random::key(78).unwrap()).unwrap();
    let scalar = Array::from_slice(&[0.5f32], &[1]).unwrap();
    for bits in [8, 4] {
        let spec = QuantSpec::new(bits, 32).unwrap();
        let dense = [w(hq * d, h, 1), w(d, h, 2), w(d, h, 3), w(h, hq * d, 4), w(f, h, 5), w(f, h, 6), w(h, f, 7)];
        let packed: Vec<Quantized> = dense.iter().map(|m| quant::quantize(m, spec).unwrap()).collect();
        let shapes = [(hq * d, h), (d, h), (d, h), (h, hq * d), (f, h), (f, h), (h, f)];
        let deq: Vec<Array> = packed.iter().zip(shapes).map(|(q, (n, k))| fma_dequantized(q, n, k)).collect();
        let pick = |i: usize, p: bool| if p { RowWeight::Packed(&packed[i]) } else { RowWeight::Dense(&deq[i]) };
        let (n1, n2) = (ones(h), ones(d));
        let qkv_w = |p: bool| QkvWeights {
            input_norm: &n1,
            wq: pick(0, p),
            q_norm: &n2,
            wk: pick(1, p),
            k_norm: &n2,
            wv: pick(2, p),
            inv_freqs: &inv,
            head_dim: d,
        };
        let (pq, pk_, pv) = row_layer::qkv(&rows, &qkv_w(true), 1e-6).unwrap();
        let (dq, dk, dv) = row_layer::qkv(&rows, &qkv_w(false), 1e-6).unwrap();
        for (p, q) in [(&pq, &dq), (&pk_, &dk), (&pv, &dv)] {
            assert_eq!(p.to_bytes().unwrap(), q.to_bytes().unwrap(), "{bits}-bit: packed q/k/v node differs");
        }
        let mixed = QkvWeights { wk: pick(1, false), ..qkv_w(true) };
        let (_, mk, _) = row_layer::qkv(&rows, &mixed, 1e-6).unwrap();
        assert_eq!(mk.to_bytes().unwrap(), dk.to_bytes().unwrap(), "{bits}-bit: a dense k beside packed q and v");
        let (n3, n4) = (ones(h), ones(h));
        let ffn_w = |p: bool| FfnWeights {
            wo: pick(3, p),
            post_attention_norm: &n3,
            pre_feedforward_norm: &n4,
            w_gate: pick(4, p),
            w_up: pick(5, p),
            w_down: pick(6, p),
            post_feedforward_norm: &n3,
            layer_scalar: &scalar,
            per_layer: None,
        };
        let pf = row_layer::ffn(&a, &x, &ffn_w(true), 1e-6).unwrap();
        let df = row_layer::ffn(&a, &x, &ffn_w(false), 1e-6).unwrap();
        assert_eq!(pf.to_bytes().unwrap(), df.to_bytes().unwrap(), "{bits}-bit: packed FFN node differs");
        // A packed matrix whose scales do not fit is refused, naming them.
        let bad = Quantized { scales: packed[4].scales.slice_axis(1, 0, 1).unwrap(), ..packed[4].clone() };
        let err = row_layer::ffn(&a, &x, &FfnWeights { w_gate: RowWeight::Packed(&bad), ..ffn_w(true) }, 1e-6);
        assert!(err.unwrap_err().to_string().contains("scales and biases"), "{bits}-bit");
    }
}

#[test]
fn bad_packed_inputs_are_refused() {
    let w = random::normal(&[8, 64], Dtype::F32, 0.0, 0.05, &random::key(1).unwrap()).unwrap();
    let x = Array::zeros(&[2, 64], Dtype::F32).unwrap();
    let six = quant::quantize(&w, QuantSpec::new(6, 64).unwrap()).unwrap();
    assert!(!six.row_readable());
    assert!(quant::row_quantized_linear(&x, &six).unwrap_err().to_string().contains("bits must be 4 or 8"));
    let q = quant::quantize(&w, QuantSpec::new(8, 64).unwrap()).unwrap();
    let narrow = Array::zeros(&[2, 32], Dtype::F32).unwrap();
    assert!(quant::row_quantized_linear(&narrow, &q).unwrap_err().to_string().contains("uint32 [N, K·bits/32]"));
    let half = Quantized { scales: q.scales.astype(Dtype::Bf16).unwrap(), ..q.clone() };
    assert!(!half.row_readable());
    assert!(quant::row_quantized_linear(&x, &half)
        .unwrap_err()
        .to_string()
        .contains("scales and biases must be float32"));
    assert!(quant::row_quantized_linear(&x.astype(Dtype::Bf16).unwrap(), &q).is_err());
}

/// The fused nodes with 4-bit matrices on the integer path (every K a multiple of 128): each row
/// alone gives the bits it has inside the batch, and the outputs stay close to the same nodes on
/// the dequantized dense matrices.
#[test]
fn fused_nodes_on_the_integer_path_keep_rows_their_own() {
    let (h, d, hq, f) = (128usize, 32usize, 4usize, 256usize);
    assert!(quant::int8_activations(h, 4) || std::env::var_os("MLX_CORE_Q4_F32").is_some());
    let w = |n: usize, k: usize, seed: u64| {
        random::normal(&[n as i32, k as i32], Dtype::F32, 0.0, 0.1, &random::key(seed).unwrap()).unwrap()
    };
    let ones = |n: usize| Array::ones(&[n as i32], Dtype::F32).unwrap();
    let inv: Vec<f32> = (0..d / 2).map(|i| 10000f32.powf(-2.0 * i as f32 / d as f32)).collect();
    let inv = Array::from_slice(&inv, &[d as i32 / 2]).unwrap();
    let x = random::normal(&[5, h as i32], Dtype::F32, 0.0, 1.0, &random::key(91).unwrap()).unwrap();
    let a = random::normal(&[5, (hq * d) as i32], Dtype::F32, 0.0, 1.0, &random::key(92).unwrap()).unwrap();
    let pos: Vec<i32> = (3..8).collect();
    let scalar = Array::from_slice(&[0.5f32], &[1]).unwrap();
    let spec = QuantSpec::new(4, 64).unwrap();
    let shapes = [(hq * d, h), (d, h), (d, h), (h, hq * d), (f, h), (f, h), (h, f)];
    let dense: Vec<Array> = shapes.iter().enumerate().map(|(i, &(n, k))| w(n, k, 40 + i as u64)).collect();
    let packed: Vec<Quantized> = dense.iter().map(|m| quant::quantize(m, spec).unwrap()).collect();
    let deq: Vec<Array> = packed.iter().zip(shapes).map(|(q, (n, k))| fma_dequantized(q, n, k)).collect();
    let pick = |i: usize, p: bool| if p { RowWeight::Packed(&packed[i]) } else { RowWeight::Dense(&deq[i]) };
    let (n1, n2, n3) = (ones(h), ones(d), ones(h));
    let qkv_w = |p: bool| QkvWeights {
        input_norm: &n1,
        wq: pick(0, p),
        q_norm: &n2,
        wk: pick(1, p),
        k_norm: &n2,
        wv: pick(2, p),
        inv_freqs: &inv,
        head_dim: d,
    };
    let ffn_w = |p: bool| FfnWeights {
        wo: pick(3, p),
        post_attention_norm: &n3,
        pre_feedforward_norm: &n3,
        w_gate: pick(4, p),
        w_up: pick(5, p),
        w_down: pick(6, p),
        post_feedforward_norm: &n3,
        layer_scalar: &scalar,
        per_layer: None,
    };
    let qkv = |x: &Array, pos: &[i32], p: bool| {
        let positions = Array::from_slice(pos, &[pos.len() as i32]).unwrap();
        let (q, k, v) = row_layer::qkv(&QkvRows { x, batch: 1, positions: &positions }, &qkv_w(p), 1e-6).unwrap();
        [q, k, v]
    };
    let all = qkv(&x, &pos, true);
    let all_ffn = row_layer::ffn(&a, &x, &ffn_w(true), 1e-6).unwrap();
    for r in 0..5 {
        let xr = x.slice_axis(0, r, r + 1).unwrap();
        let one = qkv(&xr, &pos[r as usize..r as usize + 1], true);
        for (name, (o, b)) in ["q", "k", "v"].iter().zip(one.iter().zip(&all)) {
            // q/k/v come out [1, heads, rows, D]: row r is position r on the row axis.
            let in_batch = b.slice_axis(2, r, r + 1).unwrap();
            assert_eq!(o.to_bytes().unwrap(), in_batch.to_bytes().unwrap(), "{name}: row {r} alone differs");
        }
        let ffn = row_layer::ffn(&a.slice_axis(0, r, r + 1).unwrap(), &xr, &ffn_w(true), 1e-6).unwrap();
        let in_batch = all_ffn.slice_axis(0, r, r + 1).unwrap();
        assert_eq!(ffn.to_bytes().unwrap(), in_batch.to_bytes().unwrap(), "FFN: row {r} alone differs");
    }
    let close = |p: &Array, q: &Array, what: &str| {
        let max = f32s(p).iter().zip(f32s(q)).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(max < 0.1, "{what}: the integer path is {max} from the dequantized dense nodes");
    };
    for (p, q) in all.iter().zip(qkv(&x, &pos, false).iter()) {
        close(p, q, "q/k/v");
    }
    close(&all_ffn, &row_layer::ffn(&a, &x, &ffn_w(false), 1e-6).unwrap(), "FFN");
}
