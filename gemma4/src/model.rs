//! The Gemma-4 text model (mlx-lm `gemma4_text.Model`). The forward returns the
//! post-norm hidden for **all** positions; the LM head is a separate call, and caches are passed
//! in, so a verifier can score many positions in one forward.

use std::path::Path;

use mlx_core::{concatenate, Array, Dtype};

use crate::attention::{Attend, SharedKv};
use crate::cache::Cache;
use crate::compute::{ComputeDtype, Conversion, Resolved};
use crate::config::{KvSource, LayerKind, TextConfig};
use crate::error::{Error, Result};
use crate::layer::DecoderLayer;
use crate::linear::{Embedding, Linear};
use crate::mask::{self, AttnMask};
use crate::tap::{TapPoint, TapSet};
use crate::weights::WeightMap;

/// Per-layer embeddings (E2B/E4B).
struct Ple {
    embed_tokens_per_layer: Embedding,
    per_layer_model_projection: Linear,
    per_layer_projection_norm: Array,
}

/// What a tapped forward returns.
#[derive(Clone, Debug)]
pub struct ForwardOutput {
    /// Post-final-norm hidden states // `[B, L, H]`
    pub hidden: Array,
    /// The tapped states concatenated in `TapSet` order // `[B, L, H · taps]`; None if no taps.
    pub taps: Option<Array>,
}

/// A loaded Gemma-4 text model.
pub struct Model {
    cfg: TextConfig,
    embed_tokens: Embedding,
    ple: Option<Ple>,
    layers: Vec<DecoderLayer>,
    norm: Array,
    lm_head: Option<Linear>,
    /// The checkpoint directory, for errors about its weights (None when built in memory).
    source: Option<std::path::PathBuf>,
    /// Whether the first logits were checked for non-finite values (see
    /// [`Model::check_first_logits`]).
    logits_checked: std::sync::atomic::AtomicBool,
}

impl Model {
    /// Reads `dir/config.json` and the weights. A drafter checkpoint is refused as such.
    ///
    /// ```no_run
    /// let model = gemma4::Model::load(std::path::Path::new("gemma-4-e2b-it"))?;
    /// println!("{} layers, vocabulary {}", model.config().num_hidden_layers, model.config().vocab_size);
    /// # Ok::<(), gemma4::Error>(())
    /// ```
    pub fn load(dir: &Path) -> Result<Model> {
        Ok(Model::load_as(dir, ComputeDtype::Stored, mlx_core::Device::Cpu)?.0)
    }

    /// Loads computing in `dtype` (see [`crate::compute`]; `Auto` decides for `device`), and
    /// says what was chosen. Files on disk are not touched.
    pub fn load_as(dir: &Path, dtype: ComputeDtype, device: mlx_core::Device) -> Result<(Model, Resolved)> {
        refuse_drafter(dir)?;
        let mut cfg = TextConfig::from_dir(dir)?;
        let mut wm = WeightMap::load(dir, &cfg)?;
        let mut resolved = dtype.resolve(wm.f32_bytes(), wm.has_quantized(), device);
        wm.set_conversion(resolved.conversion);
        // f32 compute on the CPU's row kernels: bf16 matrices stay bf16 (read exactly as f32).
        let rows_on_cpu = device == mlx_core::Device::Cpu && mlx_core::blas::row_linear_enabled();
        wm.keep_bf16_matrices(rows_on_cpu && resolved.conversion.cast == Some(Dtype::F32));
        // `auto` there keeps 8- and 4-bit matrices packed: the packed row kernel streams a
        // quarter (an eighth) of the f32 bytes per decode step. `f32` dequantizes everything.
        if rows_on_cpu && dtype == ComputeDtype::Auto && resolved.conversion == Conversion::F32 {
            wm.keep_packed_matrices(true);
            resolved.packed = resolved.quantized;
        }
        if resolved.conversion.dequantize {
            cfg.quantization = None;
        }
        let mut model = Model::from_weights(cfg, &mut wm)?;
        wm.finish()?;
        model.source = Some(dir.to_path_buf());
        Ok((model, resolved))
    }

    /// Builds the model from sanitized weights (takes every tensor it needs from `wm`).
    pub fn from_weights(cfg: TextConfig, wm: &mut WeightMap) -> Result<Model> {
        let h = cfg.hidden_size;
        let embed_tokens = Embedding::load(wm, "embed_tokens", cfg.vocab_size, h)?;
        let ple = if cfg.has_ple() {
            let width = cfg.num_hidden_layers * cfg.hidden_size_per_layer_input;
            Some(Ple {
                embed_tokens_per_layer: Embedding::load(
                    wm,
                    "embed_tokens_per_layer",
                    cfg.vocab_size_per_layer_input,
                    width,
                )?,
                per_layer_model_projection: Linear::load(wm, "per_layer_model_projection", width, h)?,
                per_layer_projection_norm: wm
                    .get_shaped("per_layer_projection_norm.weight", &[cfg.hidden_size_per_layer_input as i32])?,
            })
        } else {
            None
        };
        let layers = cfg
            .layers
            .iter()
            .enumerate()
            .map(|(i, spec)| DecoderLayer::load(wm, &cfg, i, spec))
            .collect::<Result<Vec<_>>>()?;
        let norm = wm.get_shaped("norm.weight", &[h as i32])?;
        let lm_head =
            if cfg.tie_word_embeddings { None } else { Some(Linear::load(wm, "lm_head", cfg.vocab_size, h)?) };
        let logits_checked = std::sync::atomic::AtomicBool::new(false);
        Ok(Model { cfg, embed_tokens, ple, layers, norm, lm_head, source: None, logits_checked })
    }

    /// The validated config.
    pub fn config(&self) -> &TextConfig {
        &self.cfg
    }

    /// A fresh cache list for this model.
    pub fn new_cache(&self) -> Cache {
        Cache::new(&self.cfg)
    }

    /// Raw token embeddings (no √H scale), as drafters consume them // `[B, L]` -> `[B, L, H]`
    pub fn embed_raw(&self, ids: &Array) -> Result<Array> {
        self.embed_tokens.forward(ids)
    }

    /// The activation dtype (that of the embedding table or its scales).
    pub fn dtype(&self) -> Dtype {
        self.norm.dtype()
    }

    /// Scaled token embeddings `embed(ids) · √H` (weak scalar) // `[B, L]` -> `[B, L, H]`
    pub fn embed(&self, ids: &Array) -> Result<Array> {
        Ok(self.embed_tokens.forward(ids)?.mul_scalar((self.cfg.hidden_size as f64).sqrt())?)
    }

    /// Post-norm hidden states of every position // ids `[B, L]` -> `[B, L, H]`
    pub fn forward(&self, ids: &Array, cache: Option<&mut Cache>) -> Result<Array> {
        Ok(self.run(ids, cache, None)?.hidden)
    }

    /// Like `forward`, also returning the hidden states at `taps`.
    pub fn forward_tapped(&self, ids: &Array, cache: Option<&mut Cache>, taps: &TapSet) -> Result<ForwardOutput> {
        self.run(ids, cache, Some(taps))
    }

    /// [`Self::forward_tapped`] for a caller that needs the hidden states of the rows from
    /// `rows_from` on only (a prefill chunk of which a drafter reads the tail): every row's K/V
    /// is computed and cached, and from the last cache-writing layer's queries on (its
    /// attention and MLP, then any KV-shared layers) only those rows run. `hidden` and `taps`
    /// then hold `L − rows_from` rows.
    pub fn forward_tapped_from(
        &self,
        ids: &Array,
        cache: Option<&mut Cache>,
        taps: &TapSet,
        rows_from: usize,
    ) -> Result<ForwardOutput> {
        self.run_from(ids, &mut cache.into_iter().collect::<Vec<_>>(), Some(taps), None, rows_from)
    }

    /// Scores several new tokens in one forward with every row bit-identical to decoding them
    /// one at a time (`forward` on a `[1, 1]` input per token): the projections, norms and head
    /// are batched (row-independent kernels), and each row attends alone over exactly the keys,
    /// in exactly the order, that its one-token step would see. This is what makes greedy
    /// speculative decoding reproduce plain greedy decoding bit for bit. Cost over `forward`:
    /// L single-query attention calls per layer instead of one.
    pub fn forward_stepwise(&self, ids: &Array, cache: &mut Cache, taps: Option<&TapSet>) -> Result<ForwardOutput> {
        let l = ids.dim(-1)?;
        self.run_from(ids, &mut [cache], taps, Some(&[l]), 0)
    }

    /// [`Self::forward_stepwise`] over the rows of several sessions at once (a batched
    /// engine's step): `ids` `[1, ΣL]` holds each session's rows in turn, `lens[s]` of them for
    /// the session whose cache is `caches[s]`. Projections, norms, MLP and head run once over
    /// all rows; each row is roped from its own session's position and attends over its own
    /// session's cache, so every row is bit-identical to its one-token decode step, whatever
    /// else is in the batch. Returns every row, in the order of `ids` // `[1, ΣL, H]`
    pub fn forward_sessions(
        &self,
        ids: &Array,
        lens: &[usize],
        caches: &mut [&mut Cache],
        taps: Option<&TapSet>,
    ) -> Result<ForwardOutput> {
        let bad = |detail: String| Err(Error::Input { op: "forward_sessions", detail });
        let s = ids.shape()?;
        let total: usize = lens.iter().sum();
        if s.len() != 2 || s[0] != 1 || s[1] as usize != total {
            return bad(format!("token ids must be [1, {total}] (the sessions' rows in turn), got {s:?}"));
        }
        if lens.is_empty() || lens.contains(&0) || lens.len() != caches.len() {
            return bad(format!(
                "every session needs at least one row and its own cache: {} sessions with rows {lens:?}, {} caches",
                lens.len(),
                caches.len()
            ));
        }
        let lens: Vec<i32> = lens.iter().map(|&n| n as i32).collect();
        self.run_from(ids, caches, taps, Some(&lens), 0)
    }

    /// Tied head (or lm_head) plus softcap // `[.., H]` -> `[.., V]`
    pub fn logits_from_hidden(&self, hidden: &Array) -> Result<Array> {
        let logits = match &self.lm_head {
            Some(head) => head.forward(hidden)?,
            None => self.embed_tokens.as_linear(hidden)?,
        };
        Ok(match self.cfg.final_logit_softcapping {
            Some(c) => mlx_core::blas::softcap(&logits, c)?,
            None => logits,
        })
    }

    /// Refuses non-finite logits the first time a model loaded from disk produces any (the
    /// first forward of a request: prefill or first verify). NaN or infinite weights otherwise
    /// decode silently into pad tokens (the argmax of NaNs). One host read per loaded model;
    /// later calls return at once, and models built in memory (training) are not checked.
    pub fn check_first_logits(&self, logits: &Array) -> Result<()> {
        use std::sync::atomic::Ordering;
        let Some(dir) = &self.source else { return Ok(()) };
        if self.logits_checked.load(Ordering::Relaxed) {
            return Ok(());
        }
        // x − x is 0 for every finite x and NaN otherwise, and a sum of zeros cannot overflow.
        let x = logits.astype(Dtype::F32)?;
        let bad = x.subtract(&x)?.sum_all()?.item::<f32>()? != 0.0;
        if bad {
            return Err(Error::NonFinite {
                dir: dir.clone(),
                detail: format!(
                    "the first forward gave non-finite logits (NaN or infinity) computing in {}; the weights hold \
                     non-finite values or overflow this dtype",
                    self.dtype()
                ),
            });
        }
        self.logits_checked.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// `logits_from_hidden(forward(ids))` // `[B, L]` -> `[B, L, V]`
    pub fn logits(&self, ids: &Array, cache: Option<&mut Cache>) -> Result<Array> {
        self.logits_from_hidden(&self.forward(ids, cache)?)
    }

    fn per_layer_inputs(&self, ids: &Array, h: &Array) -> Result<Option<Array>> {
        let Some(ple) = &self.ple else { return Ok(None) };
        let cfg = &self.cfg;
        let (nl, p) = (cfg.num_hidden_layers as i32, cfg.hidden_size_per_layer_input as i32);
        let s = ids.shape()?;
        // Token-identity part: embed_per_layer(ids) · √P // [B, L, nL, P]
        let pli = ple.embed_tokens_per_layer.forward(ids)?.mul_scalar((p as f64).sqrt())?;
        let pli = pli.reshape(&[s[0], s[1], nl, p])?;
        // Context part from the *scaled* embeddings: RMSNorm(proj(h) · H^-0.5)
        let proj = ple.per_layer_model_projection.forward(h)?.mul_scalar((cfg.hidden_size as f64).powf(-0.5))?;
        let proj = proj.reshape(&[s[0], s[1], nl, p])?;
        let proj = mlx_core::blas::rms_norm(&proj, Some(&ple.per_layer_projection_norm), cfg.rms_norm_eps)?;
        Ok(Some(proj.add(&pli)?.mul_scalar(2f64.powf(-0.5))?))
    }

    fn run(&self, ids: &Array, cache: Option<&mut Cache>, taps: Option<&TapSet>) -> Result<ForwardOutput> {
        self.run_from(ids, &mut cache.into_iter().collect::<Vec<_>>(), taps, None, 0)
    }

    /// The forward: batched (`stepwise` None; at most one cache) or stepwise over segments of
    /// these lengths, one cache each.
    fn run_from(
        &self,
        ids: &Array,
        caches: &mut [&mut Cache],
        taps: Option<&TapSet>,
        stepwise: Option<&[i32]>,
        rows_from: usize,
    ) -> Result<ForwardOutput> {
        let s = ids.shape()?;
        if s.len() != 2 {
            return Err(Error::Input { op: "forward", detail: format!("token ids must be [B, L], got {s:?}") });
        }
        let (b, mut l) = (s[0], s[1]);
        if stepwise.is_some() && rows_from > 0 {
            return Err(Error::Input { op: "forward", detail: "a stepwise forward runs every row".into() });
        }
        if stepwise.is_none() && caches.len() > 1 {
            return Err(Error::Input { op: "forward", detail: "a batched forward takes at most one cache".into() });
        }
        let cut = rows_from.min(l.max(0) as usize) as i32;
        // The last layer that writes a cache: it computes every row's K/V, and from its queries
        // on only the rows from `cut` run (no later layer writes a cache).
        let last_own = self.cfg.layers.iter().rposition(|x| matches!(x.kv, KvSource::Own { .. }));
        for c in caches.iter() {
            if c.len() != self.cfg.num_caches() {
                return Err(Error::Input {
                    op: "forward",
                    detail: format!("cache has {} layers, model needs {}", c.len(), self.cfg.num_caches()),
                });
            }
        }
        let h0 = self.embed(ids)?;
        let ple = self.per_layer_inputs(ids, &h0)?;

        // One mask per layer kind (mlx-lm `_make_masks`); the sliding one is asked of the
        // cache of the first sliding layer, the full one depends on n alone.
        let n = l as usize;
        let first_sliding = match self.cfg.layers.iter().find(|x| x.kind == LayerKind::Sliding).map(|x| x.kv) {
            Some(KvSource::Own { cache_index }) => caches.first().and_then(|c| c.layer(cache_index)),
            _ => None,
        };
        let mut full_mask = mask::full_mask(n);
        // A stepwise forward masks nothing (each row gets its own keys); skip the host-built mask.
        let mut sliding_mask = if stepwise.is_some() {
            AttnMask::None
        } else {
            mask::sliding_mask(n, first_sliding, self.cfg.sliding_window)?
        };
        let mut ple = ple;
        let mut row0 = 0; // the first row still running

        let mut captured: Vec<Option<Array>> = vec![None; taps.map(|t| t.points().len()).unwrap_or(0)];
        let mut published: Vec<Option<SharedKv>> = vec![None; self.layers.len()];
        let mut h = h0;
        for (i, (layer, spec)) in self.layers.iter().zip(&self.cfg.layers).enumerate() {
            let rows_from = if Some(i) == last_own && cut > 0 { cut } else { 0 };
            if rows_from > 0 {
                // Only the rows from `cut` on go further // [B, L, ..] -> [B, L − cut, ..]
                ple = ple.map(|p| p.slice_axis(1, cut, l)).transpose()?;
                for a in captured.iter_mut().flatten() {
                    *a = a.slice_axis(1, cut, l)?;
                }
                full_mask = full_mask.query_rows(cut, l)?;
                sliding_mask = sliding_mask.query_rows(cut, l)?;
            }
            let attend = match (stepwise, spec.kind) {
                (Some(lens), _) => Attend::Stepwise(lens),
                (None, LayerKind::Full) => Attend::Batched(&full_mask),
                (None, LayerKind::Sliding) => Attend::Batched(&sliding_mask),
            };
            let pli = match &ple {
                Some(p) => Some(p.slice_axis(2, i as i32, i as i32 + 1)?.reshape(&[b, l - rows_from, -1])?),
                None => None,
            };
            let (out, kv) = match spec.kv {
                KvSource::Own { cache_index } => {
                    let lcs = caches.iter_mut().filter_map(|c| c.layer_mut(cache_index)).collect();
                    layer.forward(&h, attend, lcs, pli.as_ref(), None, rows_from)?
                }
                KvSource::Shared { donor } => {
                    let Some(shared) = published.get(donor).and_then(Option::as_ref) else {
                        return Err(Error::Input {
                            op: "forward",
                            detail: format!("layer {i}: donor {donor} has not run"),
                        });
                    };
                    let shared = if row0 > 0 { shared.for_rows_from(row0) } else { shared.clone() };
                    layer.forward(&h, attend, Vec::new(), pli.as_ref(), Some(&shared), 0)?
                }
            };
            h = out;
            if rows_from > 0 {
                l -= cut;
                row0 = cut;
            }
            if matches!(spec.kv, KvSource::Own { .. }) {
                published[i] = Some(kv);
            }
            if let Some(t) = taps {
                for slot in t.slots(TapPoint::Layer(i)) {
                    captured[slot] = Some(h.clone());
                }
            }
        }
        let hidden = mlx_core::blas::rms_norm(&h, Some(&self.norm), self.cfg.rms_norm_eps)?;
        let taps = match taps {
            Some(t) if !t.is_empty() => {
                for slot in t.slots(TapPoint::FinalNorm) {
                    captured[slot] = Some(hidden.clone());
                }
                let parts: Vec<Array> = captured
                    .into_iter()
                    .enumerate()
                    .map(|(k, a)| {
                        a.ok_or_else(|| Error::Input {
                            op: "forward_tapped",
                            detail: format!("tap {:?} is not a layer of this model", t.points()[k]),
                        })
                    })
                    .collect::<Result<_>>()?;
                Some(concatenate(&parts, -1)?)
            }
            _ => None,
        };
        Ok(ForwardOutput { hidden, taps })
    }
}

/// Drafters live in directories that look like targets (config.json, safetensors); say so
/// instead of reporting whichever config field or tensor happens to differ first.
fn refuse_drafter(dir: &Path) -> Result<()> {
    let not_target = |reason: String| Err(Error::NotATarget { dir: dir.to_path_buf(), reason });
    if dir.join("dspark.json").is_file() {
        return not_target("dspark.json is present".into());
    }
    let config = mlx_core::files::read_text(&dir.join("config.json"), mlx_core::files::JSON_LIMIT).ok();
    let value = config.and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
    let archs = value.as_ref().and_then(|v| v.get("architectures")).and_then(|a| a.as_array());
    if let Some(arch) = archs.into_iter().flatten().filter_map(|a| a.as_str()).find(|a| *a == "Gemma4DSparkModel") {
        return not_target(format!("config.json architectures lists {arch:?}"));
    }
    Ok(())
}
