//! Gemma-4 attention: q/k norms instead of 1/√d (scale 1.0), V normed without
//! weight and not roped, GQA in the kernel, and KV sharing: a shared layer reads its donor's
//! fetched K/V and the donor's pre-write offset.
//!
//! A stepwise forward may hold the rows of several sessions (a batched engine's verify windows
//! and decode steps): the rows are split into segments, one per session, each roped from its
//! own cache's offset and attending over its own cache.

use mlx_core::{concatenate, fast, Array};

use crate::cache::LayerCache;
use crate::config::{KvSource, LayerSpec};
use crate::error::Result;
use crate::linear::Linear;
use crate::mask::AttnMask;
use crate::rope::Rope;
use crate::weights::WeightMap;

/// How the queries of one forward attend.
#[derive(Clone, Copy, Debug)]
pub enum Attend<'a> {
    /// All queries in one attention call, masked as mlx-lm masks them (prefill, scoring).
    Batched(&'a AttnMask),
    /// Each query alone, over exactly the keys (and key order) a one-token decode step at its
    /// position would see, so each row is bit-identical to token-at-a-time decoding
    /// (verification). The rows are segments of these lengths, one per session, each with its
    /// own cache (one cache per segment).
    Stepwise(&'a [i32]),
}

/// What a layer attended to.
/// What attention starts from: the input-normed rows, or the un-normed rows with the layer's
/// input norm for the fused row node (norm, projections, per-head norms and RoPE in one node;
/// see [`Attention::fusable`]).
pub enum AttnInput<'a> {
    Normed(&'a Array),
    Fused { x: &'a Array, input_norm: &'a Array },
}

#[derive(Clone, Debug)]
enum Fetched {
    /// One K/V for all queries // `[B, Hkv, S, D]` each
    Batched(Array, Array),
    /// One K/V per query row, as views of the cache in pieces // `[B, Hkv, S_i, D]` in all
    Stepwise(Vec<crate::cache::KvPieces>),
    /// Each session's cache buffers (`[1, Hkv, L_s, D]` each), its number of query rows, and
    /// each row's key ranges in its session's buffers (a fused stepwise write; no views made).
    Ranges { buffers: Vec<(Array, Array)>, rows: Vec<usize>, reads: Vec<Vec<std::ops::Range<usize>>> },
}

impl Fetched {
    /// Each query row's K/V as views of its session's buffers (the composed forms' input).
    fn pieces(&self) -> Result<Vec<crate::cache::KvPieces>> {
        let Fetched::Ranges { buffers, rows, reads } = self else {
            return Err(crate::Error::Input { op: "attention", detail: "K/V are not held as ranges".into() });
        };
        let sessions = rows.iter().zip(buffers).flat_map(|(&n, kv)| std::iter::repeat_n(kv, n));
        let view = |a: &Array, r: &std::ops::Range<usize>| a.slice_axis(2, r.start as i32, r.end as i32);
        Ok(sessions
            .zip(reads)
            .map(|((k, v), ranges)| ranges.iter().map(|r| Ok((view(k, r)?, view(v, r)?))).collect())
            .collect::<mlx_core::Result<_>>()?)
    }
}

/// K/V (and RoPE offsets, one per segment) a donor publishes to its sharers.
#[derive(Clone, Debug)]
pub struct SharedKv {
    kv: Fetched,
    offsets: Vec<i32>,
}

impl SharedKv {
    /// The same K/V for a sharer that runs only the rows from `rows` on (one segment): its
    /// queries start `rows` positions later.
    pub(crate) fn for_rows_from(&self, rows: i32) -> SharedKv {
        SharedKv { kv: self.kv.clone(), offsets: self.offsets.iter().map(|o| o + rows).collect() }
    }
}

/// Applies `rope` to each segment of x `[1, H, ΣL, D]` from its own offset: one rotation with
/// a position per row (each row a batch entry of its own), so the cost does not grow with the
/// number of segments. A row gets the bits a one-segment rotation gives it (the positions are
/// the same integers; `gemma4`'s session tests check it).
fn rope_segments(rope: &Rope, x: &Array, lens: &[i32], offsets: &[i32]) -> Result<Array> {
    if lens.len() <= 1 {
        return rope.apply(x, offsets.first().copied().unwrap_or(0));
    }
    let positions: Vec<i32> = lens.iter().zip(offsets).flat_map(|(&l, &o)| o..o + l).collect();
    let pos = Array::from_slice(&positions, &[positions.len() as i32])?;
    let rows = x.transpose(&[2, 1, 0, 3])?; // [ΣL, H, 1, D]
    Ok(rope.apply_at(&rows, &pos)?.transpose(&[2, 1, 0, 3])?)
}

struct KvProj {
    k_proj: Linear,
    v_proj: Option<Linear>, // None when V = raw k_proj output (k_eq_v)
    k_norm: Array,
}

/// One attention block.
pub struct Attention {
    q_proj: Linear,
    o_proj: Linear,
    q_norm: Array,
    kv: Option<KvProj>,
    rope: Rope,
    rope_inv_freqs: Array, // [D / 2] f32, for the fused row node
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    eps: f32,
}

impl Attention {
    /// Loads `prefix.self_attn.*`.
    pub fn load(wm: &mut WeightMap, prefix: &str, spec: &LayerSpec, hidden: usize, eps: f32) -> Result<Attention> {
        let p = |n: &str| format!("{prefix}.self_attn.{n}");
        let (hq, hkv, d) = (spec.n_heads, spec.n_kv_heads, spec.head_dim);
        let q_proj = Linear::load(wm, &p("q_proj"), hq * d, hidden)?;
        let o_proj = Linear::load(wm, &p("o_proj"), hidden, hq * d)?;
        let q_norm = wm.get_shaped(&p("q_norm.weight"), &[d as i32])?;
        let kv = match spec.kv {
            KvSource::Own { .. } => Some(KvProj {
                k_proj: Linear::load(wm, &p("k_proj"), hkv * d, hidden)?,
                v_proj: if spec.has_v_proj { Some(Linear::load(wm, &p("v_proj"), hkv * d, hidden)?) } else { None },
                k_norm: wm.get_shaped(&p("k_norm.weight"), &[d as i32])?,
            }),
            KvSource::Shared { .. } => None,
        };
        let rope = Rope::new(&spec.rope, d, spec.rotary_dims)?;
        Ok(Attention {
            q_proj,
            o_proj,
            q_norm,
            kv,
            rope_inv_freqs: rope.inv_freqs()?.astype(mlx_core::Dtype::F32)?,
            rope,
            n_heads: hq as i32,
            n_kv_heads: hkv as i32,
            head_dim: d as i32,
            eps,
        })
    }

    /// x `[B, L, H]` -> (`[B, L − rows_from, H]`, the K/V this layer attended to): keys and
    /// values of every row, queries of the rows from `rows_from` on (a mask in `attend` covers
    /// just those queries). `caches`: none, or one per segment (a batched forward has one).
    pub fn forward(
        &self,
        x: AttnInput<'_>,
        attend: Attend<'_>,
        caches: Vec<&mut LayerCache>,
        shared: Option<&SharedKv>,
        rows_from: i32,
    ) -> Result<(Array, SharedKv)> {
        let (o, kv) = self.forward_heads(x, attend, caches, shared, rows_from)?;
        Ok((self.o_proj.forward(&o)?, kv))
    }

    /// The output projection as a fused layer tail reads it (None when it cannot).
    pub fn o_proj_row(&self) -> Option<mlx_core::row_layer::RowWeight<'_>> {
        self.o_proj.row_weight()
    }

    /// Whether [`AttnInput::Fused`] can serve this layer: its own K and V projections (not a
    /// KV-shared layer, V not taken from K), f32 norms and matrices the row nodes read.
    pub fn fusable(&self, input_norm: &Array) -> bool {
        let Some(proj) = &self.kv else { return false };
        let Some(v_proj) = &proj.v_proj else { return false };
        let f32s = [input_norm, &self.q_norm, &proj.k_norm].iter().all(|w| w.dtype() == mlx_core::Dtype::F32);
        f32s && self.q_proj.row_weight().is_some()
            && proj.k_proj.row_weight().is_some()
            && v_proj.row_weight().is_some()
    }

    /// q, k, v of the rows of `x` (un-normed) in one fused row node: input norm, projections,
    /// per-head norms and RoPE at `positions` (one per position along L) // x `[B, L, H]` ->
    /// (q `[B, Hq, L, D]`, k and v `[B, Hkv, L, D]`)
    fn fused_qkv(&self, x: &Array, input_norm: &Array, positions: &[i32]) -> Result<(Array, Array, Array)> {
        let (Some(proj), true) = (&self.kv, self.fusable(input_norm)) else {
            return Err(crate::Error::Input { op: "attention", detail: "this layer cannot take fused rows".into() });
        };
        let v_proj = proj.v_proj.as_ref().and_then(Linear::row_weight);
        let (Some(wq), Some(wk), Some(wv)) = (self.q_proj.row_weight(), proj.k_proj.row_weight(), v_proj) else {
            return Err(crate::Error::Input { op: "attention", detail: "this layer cannot take fused rows".into() });
        };
        let shape = x.shape()?; // [B, L, H]
        let (b, l, h) = (shape[0], shape[1], shape[2]);
        let rows = mlx_core::row_layer::QkvRows {
            x: &x.reshape(&[b * l, h])?,
            batch: b as usize,
            positions: &Array::from_slice(positions, &[l])?,
        };
        let weights = mlx_core::row_layer::QkvWeights {
            input_norm,
            wq,
            q_norm: &self.q_norm,
            wk,
            k_norm: &proj.k_norm,
            wv,
            inv_freqs: &self.rope_inv_freqs,
            head_dim: self.head_dim as usize,
        };
        Ok(mlx_core::row_layer::qkv(&rows, &weights, self.eps)?)
    }

    /// [`Self::forward`] before the output projection // `[B, L − rows_from, Hq·D]`
    pub fn forward_heads(
        &self,
        x: AttnInput<'_>,
        attend: Attend<'_>,
        caches: Vec<&mut LayerCache>,
        shared: Option<&SharedKv>,
        rows_from: i32,
    ) -> Result<(Array, SharedKv)> {
        let (x, fused_norm) = match x {
            AttnInput::Normed(x) => (x, None),
            AttnInput::Fused { x, input_norm } => (x, Some(input_norm)),
        };
        let shape = x.shape()?;
        let (b, l) = (shape[0], shape[1]);
        let lq = l - rows_from;
        let lens = match attend {
            Attend::Stepwise(lens) => lens.to_vec(),
            Attend::Batched(_) => vec![l],
        };
        let own_offsets = || -> Vec<i32> {
            match caches.is_empty() {
                true => vec![0; lens.len()],
                false => caches.iter().map(|c| c.offset() as i32).collect(),
            }
        };
        // q [B, Hq, L, D] roped, and this layer's own k, v [B, Hkv, L, D] (k roped), if any.
        let (q, own) = match fused_norm {
            Some(norm) => {
                if rows_from != 0 || shared.is_some() {
                    return Err(crate::Error::Input {
                        op: "attention",
                        detail: "fused rows need every row's query and the layer's own K/V".into(),
                    });
                }
                let offsets = own_offsets();
                let positions: Vec<i32> = lens.iter().zip(&offsets).flat_map(|(&n, &o)| o..o + n).collect();
                let (q, k, v) = self.fused_qkv(x, norm, &positions)?;
                (q, Some((k, v, offsets)))
            }
            None => {
                let xq = if rows_from > 0 { x.slice_axis(1, rows_from, l)? } else { x.clone() };
                let q = self.q_proj.forward(&xq)?.reshape(&[b, lq, self.n_heads, self.head_dim])?;
                let q = mlx_core::blas::rms_norm(&q, Some(&self.q_norm), self.eps)?.transpose(&[0, 2, 1, 3])?;
                let own = match (&self.kv, shared) {
                    (Some(proj), None) => {
                        let offsets = own_offsets();
                        let k = proj.k_proj.forward(x)?.reshape(&[b, l, self.n_kv_heads, self.head_dim])?;
                        let v = match &proj.v_proj {
                            Some(v_proj) => v_proj.forward(x)?.reshape(&[b, l, self.n_kv_heads, self.head_dim])?,
                            None => k.clone(),
                        };
                        let k = mlx_core::blas::rms_norm(&k, Some(&proj.k_norm), self.eps)?.transpose(&[0, 2, 1, 3])?;
                        let k = rope_segments(&self.rope, &k, &lens, &offsets)?;
                        let v = mlx_core::blas::rms_norm(&v, None, self.eps)?.transpose(&[0, 2, 1, 3])?;
                        Some((k, v, offsets))
                    }
                    _ => None,
                };
                let offsets = match (&own, shared) {
                    (Some((_, _, o)), _) => o.clone(),
                    (None, Some(s)) => s.offsets.clone(),
                    (None, None) => vec![],
                };
                let q_offsets: Vec<i32> = offsets.iter().map(|o| o + rows_from).collect();
                (rope_segments(&self.rope, &q, &lens, &q_offsets)?, own)
            }
        };
        let mut attended = None; // the fused stepwise node's output
        let (kv, offsets) = match (own, shared) {
            (_, Some(s)) => (s.kv.clone(), s.offsets.clone()),
            (Some((k, v, offsets)), None) => {
                let mut caches = caches;
                let kv = match attend {
                    Attend::Batched(_) => match caches.first_mut() {
                        Some(c) => {
                            let (k, v) = c.update_and_fetch(&k, &v)?;
                            Fetched::Batched(k, v)
                        }
                        None => Fetched::Batched(k, v),
                    },
                    Attend::Stepwise(_) => {
                        if caches.len() != lens.len() {
                            return Err(crate::Error::Input {
                                op: "attention",
                                detail: format!(
                                    "a stepwise forward needs one cache per segment: {} caches for {} segments",
                                    caches.len(),
                                    lens.len()
                                ),
                            });
                        }
                        // Every session's cache written and attended in one node (no per-session
                        // nodes), where each cache has buffers to write into.
                        if b == 1 && row_kernel(&q)? && caches.iter().all(|c| c.is_written()) {
                            let (mut writes, mut reads) = (Vec::new(), Vec::new());
                            for (c, &n) in caches.iter_mut().zip(&lens) {
                                let Some(w) = c.begin_stepwise(&k, &v, n as usize)? else {
                                    return Err(crate::Error::Input {
                                        op: "attention",
                                        detail: "cache is empty".into(),
                                    });
                                };
                                writes.push(w.write);
                                reads.extend(w.reads);
                            }
                            let (o, buffers) = mlx_core::row_cache::attend_and_write(&q, &k, &v, writes, &reads, 1.0)?;
                            for (c, (kb, vb)) in caches.iter_mut().zip(&buffers) {
                                c.finish_stepwise(kb.clone(), vb.clone());
                            }
                            attended = Some(o);
                            let rows = lens.iter().map(|&n| n as usize).collect();
                            Fetched::Ranges { buffers, rows, reads }
                        } else {
                            let mut rows = Vec::with_capacity(l as usize);
                            let mut start = 0;
                            for (c, &n) in caches.iter_mut().zip(&lens) {
                                let ks = k.slice_axis(2, start, start + n)?;
                                let vs = v.slice_axis(2, start, start + n)?;
                                rows.extend(c.update_and_fetch_stepwise_pieces(&ks, &vs)?);
                                start += n;
                            }
                            Fetched::Stepwise(rows)
                        }
                    }
                };
                (kv, offsets)
            }
            (None, None) => {
                return Err(crate::Error::Input {
                    op: "attention",
                    detail: "KV-shared layer received no donor K/V".into(),
                })
            }
        };
        let o = match (attended, &kv, attend) {
            (Some(o), _, _) => o,
            (None, Fetched::Ranges { buffers, rows, reads }, Attend::Stepwise(_)) if b == 1 && row_kernel(&q)? => {
                // A KV-shared layer over its donor's fused write: its ranges, in one node.
                mlx_core::row_cache::attend_ranges(&q, buffers, rows, reads, 1.0)?
            }
            (None, Fetched::Ranges { .. }, Attend::Stepwise(_)) => {
                mlx_core::blas::row_attention_pieces(&q, &kv.pieces()?, 1.0)?
            }
            // A one-token step goes through the row kernel when stepwise rows do, so the two agree.
            (None, Fetched::Batched(k, v), Attend::Batched(AttnMask::None)) if lq == 1 && row_kernel(&q)? => {
                mlx_core::blas::row_attention(&q, &[(k.clone(), v.clone())], 1.0)?
            }
            (None, Fetched::Batched(k, v), Attend::Batched(mask)) => {
                fast::scaled_dot_product_attention(&q, k, v, 1.0, mask.as_fast())?
            }
            (None, Fetched::Stepwise(rows), Attend::Stepwise(_)) if row_kernel(&q)? => {
                // Every row over its own keys in one node (mlx-core's row-invariant kernel).
                mlx_core::blas::row_attention_pieces(&q, rows, 1.0)?
            }
            (None, Fetched::Stepwise(rows), Attend::Stepwise(_)) => {
                // One unmasked single-query call per row, as a decode step makes it.
                let outs = rows
                    .iter()
                    .enumerate()
                    .map(|(i, pieces)| {
                        let qi = q.slice_axis(2, i as i32, i as i32 + 1)?; // [B, Hq, 1, D]
                        let (k, v) = crate::cache::join_pieces(pieces.clone())?;
                        fast::scaled_dot_product_attention(&qi, &k, &v, 1.0, fast::Mask::None)
                    })
                    .collect::<mlx_core::Result<Vec<_>>>()?;
                concatenate(&outs, 2)?
            }
            _ => {
                return Err(crate::Error::Input {
                    op: "attention",
                    detail: "donor and sharer attend in different modes".into(),
                })
            }
        };
        let o = o.transpose(&[0, 2, 1, 3])?.reshape(&[b, lq, -1])?; // [B, L − rows_from, Hq·D]
        Ok((o, SharedKv { kv, offsets }))
    }
}

/// Whether single-query rows use mlx-core's row-invariant attention kernel: f32 on the CPU,
/// where the row-invariant linear kernel is on too (`MLX_CORE_ROW_LINEAR=0` turns both off,
/// which reproduces mlx-lm's kernels).
fn row_kernel(q: &Array) -> Result<bool> {
    Ok(mlx_core::blas::row_kernels_for(q)?)
}
