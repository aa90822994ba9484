//! The DSpark drafter (variant "dspark"; see docs/architecture.md, "Drafters", and
//! docs/formats.md, "DSpark drafters"): a parallel DFlash backbone over the block
//! `[anchor, γ−1 mask slots]` whose layers attend bidirectionally over the projected
//! multi-layer target context H_ctx = RMSNorm(W_c · taps) plus the block, then a Markov head
//! (B_k = W1[x_{k−1}]·W2) and confidence heads (c_k = σ(w·[h_k; W1[x_{k−1}]] + b), see
//! `confidence`); the target's own LM head turns the backbone output into logits.
//!
//! Context K/V are cached per layer: every op on a context row (W_c, RMSNorm, the layer's norm
//! and K/V projections) is per-row, so projecting committed rows once and appending is exact and
//! a round never re-projects (or copies) the whole context.
//!
//! Weights are f32 and stored `[in, out]` (used as `x @ W`). Inference is semi-autoregressive:
//! one backbone pass, then the Markov walk on the device; greedy drafting needs no host read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use gemma4::checkpoint::{write_json, StagedDir};
use gemma4::config::QuantizationConfig;
use gemma4::weights::{LinearWeights, WeightMap};
use gemma4::{TapSet, TextConfig};
use mlx_core::blas::row_kernels_for;
use mlx_core::quant::Quantized;
use mlx_core::random::{self, KeyChain};
use mlx_core::row_markov::Walk;
use mlx_core::{concatenate, fast, Array, Dtype};

use super::config::{
    check_target, param_kind, read_descriptor, target_id, DSparkConfig, Descriptor, Dims, ParamKind, FORMAT_VERSION,
    KIND,
};
use crate::drafter::{DraftRequest, DraftSampling, Drafter, Proposal};
use crate::drafters::context_cache::{ContextCache, LayerKv};
use crate::error::{Error, Result};

/// The matmul weights of one backbone layer. Dense matrices are stored `[in, out]` and used as
/// `x @ W`; they are held as `LinearWeights::Dense(Wᵀ)`, materialised `[out, in]`, so the dense
/// and quantized cases share gemma4's `x @ Wᵀ` product and the CPU's row kernel reads the
/// weight rows in place.
pub(super) struct Layer {
    pub(super) attn_norm: Array,
    pub(super) q: LinearWeights,
    pub(super) k: LinearWeights,
    pub(super) v: LinearWeights,
    pub(super) o: LinearWeights,
    pub(super) ff_norm: Array,
    pub(super) gate: LinearWeights,
    pub(super) up: LinearWeights,
    pub(super) down: LinearWeights,
}

/// Every parameter as a typed field, so the forward never looks anything up by name.
pub(super) struct Weights {
    pub(super) layers: Vec<Layer>,
    /// Context projection `[m·H, D]`.
    pub(super) w_c: LinearWeights,
    pub(super) ctx_norm: Array,
    /// Anchor embedding projection `[H, D]`.
    pub(super) tok_proj: LinearWeights,
    /// Embeddings of the γ−1 mask slots // `[max(γ−1, 1), D]`
    pub(super) mask_emb: Array,
    /// Block position embeddings // `[γ, D]`
    pub(super) block_pos: Array,
    pub(super) out_norm: Array,
    /// Back to the target's hidden size `[D, H]`.
    pub(super) out_proj: LinearWeights,
    /// Markov gather table, rows are tokens // `[V, r]`
    pub(super) markov_w1: LinearWeights,
    /// Markov bias projection `[r, V]`.
    pub(super) markov_w2: LinearWeights,
    /// Confidence head `[I, 1]` and bias `[1]` (always dense; I from
    /// `DSparkConfig::confidence_inputs`).
    pub(super) conf_w: Array,
    pub(super) conf_b: Array,
    /// The greedy confidence head, same shapes (`greedyHead`).
    pub(super) conf_greedy: Option<(Array, Array)>,
}

/// Parameters that may be quantized: the matmul weights and the Markov gather table.
fn quantizable(name: &str) -> bool {
    matches!(param_kind(name), ParamKind::Matrix | ParamKind::GatherTable)
}

/// A DSpark drafter bound to one target.
pub struct DSparkDrafter {
    cfg: DSparkConfig,
    dims: Dims,
    target_id: String,
    taps: TapSet,
    /// Shared by the forks of one loaded drafter (an engine's sessions, all on its one thread).
    w: Rc<Weights>,
    /// Dense parameters by name, as loaded or initialised (what `save` writes).
    params: BTreeMap<String, Array>,
    ctx: Option<ContextCache>,
    /// Committed tapped rows not yet projected into the context // each `[1, k, m·H]`: a
    /// commit only stores them, and the next proposal projects every stored row at once (for
    /// all the requests of a batched proposal together), so rounds that do not draft cost no
    /// projection of their own.
    unprojected: Vec<Array>,
    unprojected_len: usize,
}

impl Weights {
    pub(super) fn build(
        cfg: &DSparkConfig,
        params: &BTreeMap<String, Array>,
        quantized: &BTreeMap<String, Quantized>,
    ) -> Result<Weights> {
        let missing = |n: &str| Error::Contract(format!("dspark parameter {n} missing"));
        let dense = |n: &str| params.get(n).cloned().ok_or_else(|| missing(n));
        let linear = |n: &str| -> Result<LinearWeights> {
            if !quantizable(n) {
                return Err(Error::Contract(format!("dspark parameter {n} is not a matrix")));
            }
            Ok(match quantized.get(n) {
                Some(q) => LinearWeights::Quantized(q.clone()),
                // The gather table keeps its stored orientation; matmul weights are `[in, out]`.
                None if n == "markov.w1" => LinearWeights::Dense(dense(n)?),
                // Materialised as [out, in] once: the CPU's row kernel reads weight rows in
                // place, and a transposed view would be copied on every product.
                None => LinearWeights::Dense(dense(n)?.transpose(&[1, 0])?.contiguous()?),
            })
        };
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let name = |f: &str| format!("bb.{i}.{f}");
                Ok(Layer {
                    attn_norm: dense(&name("attn_norm"))?,
                    q: linear(&name("q"))?,
                    k: linear(&name("k"))?,
                    v: linear(&name("v"))?,
                    o: linear(&name("o"))?,
                    ff_norm: dense(&name("ff_norm"))?,
                    gate: linear(&name("gate"))?,
                    up: linear(&name("up"))?,
                    down: linear(&name("down"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Weights {
            layers,
            w_c: linear("W_c")?,
            ctx_norm: dense("ctx_norm")?,
            tok_proj: linear("tok_proj")?,
            mask_emb: dense("mask_emb")?,
            block_pos: dense("block_pos")?,
            out_norm: dense("out_norm")?,
            out_proj: linear("out_proj")?,
            markov_w1: linear("markov.w1")?,
            markov_w2: linear("markov.w2")?,
            conf_w: dense("conf.w")?,
            conf_b: dense("conf.b")?,
            conf_greedy: if cfg.greedy_head { Some((dense("conf_greedy.w")?, dense("conf_greedy.b")?)) } else { None },
        })
    }

    fn linears(&self) -> impl Iterator<Item = &LinearWeights> {
        let per_layer = self.layers.iter().flat_map(|l| [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]);
        per_layer.chain([&self.w_c, &self.tok_proj, &self.out_proj, &self.markov_w1, &self.markov_w2])
    }
}

impl DSparkDrafter {
    pub(super) fn from_params(
        cfg: DSparkConfig,
        dims: Dims,
        target_id: String,
        taps: TapSet,
        mut params: BTreeMap<String, Array>,
        quantized: BTreeMap<String, Quantized>,
    ) -> Result<Self> {
        params.retain(|n, _| !quantized.contains_key(n));
        let w = Rc::new(Weights::build(&cfg, &params, &quantized)?);
        Ok(DSparkDrafter {
            cfg,
            dims,
            target_id,
            taps,
            w,
            params,
            ctx: None,
            unprojected: Vec::new(),
            unprojected_len: 0,
        })
    }

    /// True if any matrix is quantized.
    pub fn is_quantized(&self) -> bool {
        self.w.linears().any(|m| matches!(m, LinearWeights::Quantized(_)))
    }

    /// A freshly initialised drafter for `target` (norms 1, matrices N(0, 0.02²),
    /// `markov.w2` and the confidence heads zero). `random_heads` also draws the Markov and
    /// confidence heads at random, so untrained drafters exercise those paths in tests.
    pub fn init(
        cfg: DSparkConfig,
        target: &TextConfig,
        model_name: &str,
        seed: u64,
        random_heads: bool,
    ) -> Result<Self> {
        let dims = Dims {
            hidden_size: target.hidden_size,
            vocab_size: target.vocab_size,
            eps: target.rms_norm_eps,
            num_layers: Some(target.num_hidden_layers),
        };
        cfg.validate(Path::new("<new drafter>"))?;
        let mut keys = KeyChain::new(seed)?;
        let mut params = BTreeMap::new();
        for name in cfg.param_names() {
            let shape = cfg.param_shape(&name, &dims).ok_or_else(|| Error::Contract(format!("no shape for {name}")))?;
            let key = keys.next_key()?;
            let is_norm = name.ends_with("norm");
            let head_w = matches!(name.as_str(), "conf.w" | "conf_greedy.w");
            let bias = name.ends_with(".b");
            let zero = (name == "markov.w2" || head_w) && !random_heads;
            let a = if is_norm {
                Array::ones(&shape, Dtype::F32)?
            } else if zero || bias {
                Array::zeros(&shape, Dtype::F32)?
            } else {
                let std = if head_w { 0.5 } else { 0.02 };
                random::normal(&shape, Dtype::F32, 0.0, std, &key)?
            };
            params.insert(name, a);
        }
        let taps = cfg.tap_set(target.num_hidden_layers);
        Self::from_params(cfg, dims, target_id(model_name, target), taps, params, BTreeMap::new())
    }

    /// Replaces dense parameters (shapes are checked) and rebuilds the module.
    pub fn with_params(self, updates: BTreeMap<String, Array>) -> Result<Self> {
        let params = self.updated_params(updates)?;
        Self::from_params(self.cfg, self.dims, self.target_id, self.taps, params, BTreeMap::new())
    }

    /// The dense parameters with `updates` applied (names and shapes checked, cast to f32).
    fn updated_params(&self, updates: impl IntoIterator<Item = (String, Array)>) -> Result<BTreeMap<String, Array>> {
        if self.is_quantized() {
            return Err(Error::Contract("cannot update parameters of a quantized drafter".into()));
        }
        let mut params = self.params.clone();
        for (name, a) in updates {
            let want = self
                .cfg
                .param_shape(&name, &self.dims)
                .ok_or_else(|| Error::Contract(format!("unknown parameter {name}")))?;
            if a.shape()? != want {
                return Err(Error::Contract(format!("parameter {name}: shape {:?}, expected {want:?}", a.shape()?)));
            }
            params.insert(name, a.astype(Dtype::F32)?);
        }
        Ok(params)
    }

    /// Loads `dir` (dspark.json + model*.safetensors) for `target`.
    pub fn load(dir: &Path, target: &TextConfig) -> Result<Self> {
        Self::load_as(dir, target, false)
    }

    /// [`DSparkDrafter::load`], with quantized weights dequantized to dense f32 at load when
    /// `dequantize` (the drafter then runs as its f32 original, with the quantization's values).
    pub fn load_as(dir: &Path, target: &TextConfig, dequantize: bool) -> Result<Self> {
        let d = read_descriptor(dir)?;
        check_target(&d, target)?;
        let raw = gemma4::weights::load_raw(dir)?;
        let quant_cfg = match &d.quantization {
            Some(v) => Some(
                QuantizationConfig::from_json(v, "quantization")
                    .map_err(|e| Error::checkpoint(&dir.join("dspark.json"), e.to_string()))?,
            ),
            None => None,
        };
        // Quantized tensors are read by gemma4's WeightMap: one implementation for targets and
        // drafters. A quantized matrix P stores quantize(Pᵀ) as P.weight / P.scales / P.biases.
        // Strict: every tensor must be a parameter (dense, or the .weight/.scales/.biases of a
        // quantized one), so a checkpoint of another shape is refused, not half-read.
        let names: std::collections::BTreeSet<String> = d.config.param_names().into_iter().collect();
        let is_param = |k: &str| {
            names.contains(k)
                || [".weight", ".scales", ".biases"]
                    .iter()
                    .any(|s| k.strip_suffix(s).is_some_and(|b| names.contains(b)))
        };
        if let Some(extra) = raw.keys().find(|k| !is_param(k)) {
            return Err(Error::checkpoint(
                dir,
                format!("unexpected tensor {extra:?}: not a parameter of this DSpark config"),
            ));
        }
        let mut wm = WeightMap::from_tensors(dir, raw.clone(), "", quant_cfg.clone());
        if dequantize {
            wm.set_conversion(gemma4::compute::Conversion::F32);
        }
        let mut params = BTreeMap::new();
        let mut quantized = BTreeMap::new();
        for name in d.config.param_names() {
            let want = d
                .config
                .param_shape(&name, &d.dims)
                .ok_or_else(|| Error::checkpoint(dir, format!("no shape for parameter {name:?}")))?;
            if raw.contains_key(&format!("{name}.scales")) {
                if param_kind(&name) == ParamKind::ConfidenceHead {
                    return Err(Error::checkpoint(
                        dir,
                        format!("{name} is quantized, but the confidence head must stay dense (pruning thresholds are sensitive to it)"),
                    ));
                }
                if quant_cfg.is_none() {
                    return Err(Error::checkpoint(
                        dir,
                        format!("{name} has quantized tensors (.scales) but dspark.json has no quantization block"),
                    ));
                }
                // Gather tables keep their stored orientation; matmul weights are stored transposed.
                let (out, inp) = if name == "markov.w1" { (want[0], want[1]) } else { (want[1], want[0]) };
                match wm.linear(&name, out as usize, inp as usize)? {
                    LinearWeights::Quantized(q) => {
                        quantized.insert(name, q);
                    }
                    LinearWeights::Dense(a) | LinearWeights::Bf16AsF32(a) => {
                        // Dequantized as stored: matmul parameters come back transposed.
                        let a = if name == "markov.w1" { a } else { a.transpose(&[1, 0])?.contiguous()? };
                        if a.shape()? != want {
                            return Err(Error::checkpoint(
                                dir,
                                format!("{name} dequantizes to shape {:?}, expected {want:?}", a.shape()?),
                            ));
                        }
                        params.insert(name, a.astype(Dtype::F32)?);
                    }
                }
                continue;
            }
            let a = raw.get(&name).ok_or_else(|| Error::checkpoint(dir, format!("missing tensor {name:?}")))?;
            if a.shape()? != want {
                return Err(Error::checkpoint(
                    dir,
                    format!("tensor {name:?} has shape {:?}, expected {want:?}", a.shape()?),
                ));
            }
            params.insert(name, a.astype(Dtype::F32)?);
        }
        let taps = d.config.tap_set(target.num_hidden_layers);
        Self::from_params(d.config, d.dims, d.target_id, taps, params, quantized)
    }

    /// Writes the checkpoint (dspark.json + model.safetensors) atomically.
    pub fn save(&self, dest: &Path, force: bool) -> Result<PathBuf> {
        if self.is_quantized() {
            return Err(Error::Contract("a quantized DSpark drafter is written by drafter-quant, not saved".into()));
        }
        let staged = StagedDir::new(dest, force)?;
        let names = self.cfg.param_names();
        let tensors: Vec<(&str, &Array)> =
            names.iter().filter_map(|n| self.params.get(n).map(|a| (n.as_str(), a))).collect();
        let meta = [("format".to_string(), "mlx".to_string())].into_iter().collect();
        mlx_core::save_safetensors(&staged.path().join("model.safetensors"), tensors, &meta)?;
        let d = Descriptor {
            kind: KIND.into(),
            variant: Some("dspark".into()),
            version: FORMAT_VERSION,
            target_id: self.target_id.clone(),
            config: self.cfg.clone(),
            dims: self.dims.clone(),
            param_names: names,
            quantization: None,
            head: super::config::TARGET_HEAD.to_string(),
        };
        let v = serde_json::to_value(&d).map_err(|e| Error::Contract(e.to_string()))?;
        write_json(&staged.path().join("dspark.json"), &v)?;
        Ok(staged.commit()?)
    }

    /// The dense parameters in `DSparkConfig::param_names` order, for training (a quantized
    /// drafter has none to train).
    pub fn trainable_params(&self) -> Result<Vec<Array>> {
        if self.is_quantized() {
            return Err(Error::Contract("a quantized DSpark drafter cannot be trained".into()));
        }
        self.cfg
            .param_names()
            .iter()
            .map(|n| {
                self.params.get(n).cloned().ok_or_else(|| Error::Contract(format!("dspark parameter {n} missing")))
            })
            .collect()
    }

    /// The same drafter with trained parameters (dense, in `DSparkConfig::param_names` order;
    /// shapes checked).
    pub fn with_trained(&self, params: &[Array]) -> Result<Self> {
        let names = self.cfg.param_names();
        if names.len() != params.len() {
            return Err(Error::Contract(format!("{} parameters given, the config has {}", params.len(), names.len())));
        }
        let map = self.updated_params(names.into_iter().zip(params.iter().cloned()))?;
        Self::from_params(
            self.cfg.clone(),
            self.dims.clone(),
            self.target_id.clone(),
            self.taps.clone(),
            map,
            BTreeMap::new(),
        )
    }

    /// The target dimensions the drafter was built for.
    pub fn dims(&self) -> &Dims {
        &self.dims
    }

    /// The module configuration.
    pub fn config(&self) -> &DSparkConfig {
        &self.cfg
    }

    /// Sets calibrated thresholds (`config.sts`).
    pub fn set_calibration(&mut self, c: Option<super::config::Calibration>) {
        self.cfg.sts = c;
    }

    fn rms(&self, x: &Array, w: &Array) -> Result<Array> {
        Ok(mlx_core::blas::rms_norm(x, Some(w), self.dims.eps)?)
    }

    fn heads(&self, x: &Array) -> Result<Array> {
        // [B, L, D] -> [B, heads, L, hd]
        let (b, l) = (x.dim(0)?, x.dim(1)?);
        let hd = (self.cfg.d_draft / self.cfg.n_heads) as i32;
        Ok(x.reshape(&[b, l, self.cfg.n_heads as i32, hd])?.transpose(&[0, 2, 1, 3])?)
    }

    /// Projects tapped rows into every layer's context K/V // `[1, L, m·H]` -> per layer `[1, h, L, hd]`
    fn project_context(&self, rows: &Array) -> Result<Vec<LayerKv>> {
        let x = self.w.w_c.matmul_t(&rows.astype(Dtype::F32)?)?;
        let hctx = self.rms(&x, &self.w.ctx_norm)?; // [1, L, D]
        self.w
            .layers
            .iter()
            .map(|l| match self.normed_heads(&hctx, &l.attn_norm, &[&l.k, &l.v])?.as_slice() {
                [k, v] => Ok(LayerKv { k: k.clone(), v: v.clone() }),
                _ => Err(Error::Contract("dspark: context projection gave no K/V".into())),
            })
            .collect()
    }

    /// `rms_norm(x)·norm` projected by each of `ws`, by head // x `[B, L, D]` -> per matrix
    /// `[B, heads, L, hd]`. Few f32 rows on the CPU run as one node (the same bits as the
    /// composed form: its norm and products are the same row kernels).
    fn normed_heads(&self, x: &Array, norm: &Array, ws: &[&LinearWeights]) -> Result<Vec<Array>> {
        let (b, l) = (x.dim(0)?, x.dim(1)?);
        if let Some(rw) = self.fusable(x, &[norm], ws)? {
            let hd = self.cfg.d_draft / self.cfg.n_heads;
            let flat = x.reshape(&[b * l, -1])?; // [B·L, D]
            return Ok(mlx_core::row_layer::normed_heads(&flat, b as usize, norm, &rw, hd, self.dims.eps)?);
        }
        let n = self.rms(x, norm)?;
        ws.iter().map(|w| self.heads(&w.matmul_t(&n)?)).collect()
    }

    /// The matrices as the fused row nodes read them, when those nodes take `x`: few f32 rows
    /// on the CPU with the row kernels on, f32 `vectors`, and every matrix row-readable.
    fn fusable<'a>(
        &self,
        x: &Array,
        vectors: &[&Array],
        ws: &[&'a LinearWeights],
    ) -> Result<Option<Vec<mlx_core::row_layer::RowWeight<'a>>>> {
        let rows = x.size()? / (x.dim(-1)?.max(1) as usize);
        if rows > mlx_core::blas::ROW_LINEAR_MAX_ROWS
            || !row_kernels_for(x)?
            || vectors.iter().any(|v| v.dtype() != Dtype::F32)
        {
            return Ok(None);
        }
        Ok(ws.iter().map(|w| w.row_weight()).collect())
    }

    /// The backbone over the block // anchor `[1]` -> block hidden `[1, γ, D]`
    /// The backbone over the blocks of several requests, each attending over its own context
    /// // anchors `[R]` -> `[R, γ, D]`. Every product runs once over all R·γ rows (row-invariant
    /// kernels: a request's rows get the bits they get alone); attention runs per row over its
    /// own request's `[context; block]`.
    fn backbone(&self, ctxs: &mut [ContextCache], target: &gemma4::Model, anchors: &Array) -> Result<Array> {
        let g = self.cfg.gamma as i32;
        let r = ctxs.len() as i32;
        let emb = target.embed_raw(&anchors.reshape(&[r, 1])?)?.astype(Dtype::F32)?; // [R, 1, H]
        let pos = &self.w.block_pos;
        let row0 = self.w.tok_proj.matmul_t(&emb)?.add(&pos.slice_axis(0, 0, 1)?)?; // [R, 1, D]
        let mut h = if g > 1 {
            let masks = self.w.mask_emb.add(&pos.slice_axis(0, 1, g)?)?.expand_dims(0)?; // [1, γ−1, D]
            let masks = masks.broadcast_to(&[r, g - 1, self.cfg.d_draft as i32])?;
            concatenate(&[&row0, &masks], 1)?
        } else {
            row0
        }; // [R, γ, D]
        let scale = ((self.cfg.d_draft / self.cfg.n_heads) as f32).powf(-0.5);
        for (i, l) in self.w.layers.iter().enumerate() {
            let (q, k, v) = match self.normed_heads(&h, &l.attn_norm, &[&l.q, &l.k, &l.v])?.as_slice() {
                [q, k, v] => (q.clone(), k.clone(), v.clone()), // each [R, h, γ, hd]
                _ => return Err(Error::Contract("dspark: the backbone's projection gave no q/k/v".into())),
            };
            let mut kvs = Vec::with_capacity(ctxs.len());
            for (s, ctx) in ctxs.iter_mut().enumerate() {
                let s = s as i32;
                let block = LayerKv { k: k.slice_axis(0, s, s + 1)?, v: v.slice_axis(0, s, s + 1)? };
                let (k, v) = ctx.with_block(i, &block)?; // [1, h, L+γ, hd]
                kvs.push(match self.cfg.ctx_window {
                    // The last `w` context rows and the block // [1, h, w+γ, hd]
                    Some(w) if ctx.stored() > w => {
                        let (from, to) = ((ctx.stored() - w) as i32, k.dim(2)?);
                        (k.slice_axis(2, from, to)?, v.slice_axis(2, from, to)?)
                    }
                    _ => (k, v),
                });
            }
            let a = block_attention(&q, &kvs, scale)?; // [R, h, γ, hd]
            let a = a.transpose(&[0, 2, 1, 3])?.reshape(&[r, g, -1])?; // [R, γ, h·hd]
            if let Some(w) = self.fusable(&h, &[&l.ff_norm], &[&l.o, &l.gate, &l.up, &l.down])? {
                // The layer's tail as one node, the composed form's bits.
                let w = mlx_core::row_layer::PreNormFfnWeights {
                    wo: w[0],
                    ff_norm: &l.ff_norm,
                    w_gate: w[1],
                    w_up: w[2],
                    w_down: w[3],
                };
                let flat = |t: &Array| t.reshape(&[r * g, -1]);
                h = mlx_core::row_layer::prenorm_ffn(&flat(&a)?, &flat(&h)?, &w, self.dims.eps)?
                    .reshape(&[r, g, -1])?;
                continue;
            }
            h = h.add(&l.o.matmul_t(&a)?)?;
            let f = self.rms(&h, &l.ff_norm)?;
            let ff = l.down.matmul_t(&gemma4::gelu(&l.gate.matmul_t(&f)?)?.multiply(&l.up.matmul_t(&f)?)?)?;
            h = h.add(&ff)?;
        }
        self.rms(&h, &self.w.out_norm)
    }

    /// Proposals for the requests of `group` (this drafter's forks: they share its weights),
    /// one forward for all (see [`propose_batch`]).
    fn propose_group(group: &mut [&mut DSparkDrafter], reqs: Vec<DraftRequest<'_>>) -> Result<Vec<Proposal>> {
        let Some(lead) = group.first() else { return Ok(Vec::new()) };
        if reqs.len() != group.len() || group.iter().any(|d| !Rc::ptr_eq(&d.w, &lead.w)) {
            return Err(Error::Contract(
                "a batched DSpark proposal needs one request per drafter, all forks of one drafter".into(),
            ));
        }
        let (w, cfg) = (Rc::clone(&lead.w), lead.cfg.clone());
        let me = lead.shell();
        me.project_unprojected(group)?;
        let target = reqs[0].target;
        let anchors: Vec<&Array> = reqs.iter().map(|q| q.anchor).collect();
        let anchors = concatenate(&anchors, 0)?; // [R]
        let mut ctxs = Vec::with_capacity(group.len());
        for d in group.iter_mut() {
            match d.ctx.take() {
                Some(c) => ctxs.push(c),
                None => {
                    for (d, c) in group.iter_mut().zip(ctxs) {
                        d.ctx = Some(c);
                    }
                    return Err(Error::Contract("dspark: propose before reset".into()));
                }
            }
        }
        let block = me.backbone(&mut ctxs, target, &anchors);
        for (d, c) in group.iter_mut().zip(ctxs) {
            d.ctx = Some(c);
        }
        let block = block?; // [R, γ, D]
                            // Each request's first n rows, request after request // [Σn, D]
        let ns: Vec<usize> = reqs.iter().map(|q| q.max_drafts.clamp(1, cfg.gamma)).collect();
        let mut starts = Vec::with_capacity(ns.len());
        let mut total = 0usize;
        let mut parts = Vec::with_capacity(ns.len());
        for (s, &n) in ns.iter().enumerate() {
            starts.push(total);
            total += n;
            parts.push(block.slice_axis(0, s as i32, s as i32 + 1)?.slice_axis(1, 0, n as i32)?.squeeze(0)?);
        }
        let rows = concatenate(&parts, 0)?; // [Σn, D]
                                            // The backbone needs the whole block (its attention is bidirectional), but only the
                                            // wanted rows go through the target's LM head, the largest matmul of a round.
        let to_target = w.out_proj.matmul_t(&rows)?.astype(target.dtype())?;
        let u = target.logits_from_hidden(&to_target)?.astype(Dtype::F32)?; // [Σn, V]
        let (w1, w2) = (&w.markov_w1, &w.markov_w2);

        // All greedy with plain f32 tables on the CPU: the whole walk is one node (the same bits).
        let greedy: Vec<bool> = reqs.iter().map(|q| q.sampling.is_greedy()).collect();
        let fused = match (w1.row_matrix(), w2.row_matrix()) {
            (Some(t1), Some(t2)) if greedy.iter().all(|&g| g) && row_kernels_for(&u)? => {
                Some(mlx_core::row_markov::greedy(&u, t1, t2, &anchors.astype(Dtype::U32)?, &ns)?)
            }
            _ => None,
        };
        let (Walk { tokens, logits, e1: e1s }, qs) = match fused {
            Some(walk) => (walk, vec![Vec::new(); ns.len()]),
            None => Self::walk(&u, w1, w2, &anchors, reqs, &ns, &starts)?,
        };
        // Every row's confidence in one product per head: each reads only its own row.
        let score = |greedy: bool| -> Result<Array> {
            let (cw, cb) = match (&w.conf_greedy, greedy) {
                (Some((cw, cb)), true) => (cw, cb),
                _ => (&w.conf_w, &w.conf_b),
            };
            super::confidence::score(&rows, &e1s, &logits, cfg.conf_law, cw, cb)
        };
        let (mut conf_greedy, mut conf_sampled) = (None, None);
        let mut out = Vec::with_capacity(ns.len());
        for (s, &n) in ns.iter().enumerate() {
            let conf = match greedy[s] {
                true => conf_greedy.get_or_insert_with(|| score(true)),
                false => conf_sampled.get_or_insert_with(|| score(false)),
            };
            let conf = match conf {
                Ok(c) => c,
                Err(e) => return Err(Error::Contract(format!("dspark confidence: {e}"))),
            };
            let (a, b) = (starts[s] as i32, (starts[s] + n) as i32);
            out.push(Proposal {
                tokens: tokens.slice_axis(0, a, b)?,
                logits: Some(logits.slice_axis(0, a, b)?),
                q: if qs[s].is_empty() { None } else { Some(concatenate(&qs[s].iter().collect::<Vec<_>>(), 0)?) },
                confidence: Some(conf.slice_axis(0, a, b)?), // [n]
            });
        }
        Ok(out)
    }

    /// The Markov walk composed from MLX's ops, every request's position k at once:
    /// l_k = u_k + W2·W1[x_{k−1}], x_k greedy or drawn. -> (tokens `[Σn]`, logits `[Σn, V]`,
    /// e1 `[Σn, r]`, each request's draw distributions q), request after request.
    fn walk(
        u: &Array,
        w1: &LinearWeights,
        w2: &LinearWeights,
        anchors: &Array,
        reqs: Vec<DraftRequest<'_>>,
        ns: &[usize],
        starts: &[usize],
    ) -> Result<(Walk, Vec<Vec<Array>>)> {
        let total: usize = ns.iter().sum();
        let mut sampling: Vec<DraftSampling<'_>> = Vec::with_capacity(reqs.len());
        let mut uniforms = Vec::with_capacity(reqs.len());
        for (q, &n) in reqs.into_iter().zip(ns) {
            let mut sm = q.sampling;
            uniforms.push(sm.uniforms(n)?);
            sampling.push(sm);
        }
        let max_n = ns.iter().copied().max().unwrap_or(0);
        let mut prev: Vec<Array> = anchors_split(anchors, ns.len())?;
        // Row order of the per-position outputs below: position-major, requests in order.
        let mut order: Vec<(usize, usize)> = Vec::with_capacity(total);
        let (mut toks_k, mut logits_k, mut e1_k) = (Vec::new(), Vec::new(), Vec::new());
        let mut qs: Vec<Vec<Array>> = vec![Vec::new(); ns.len()];
        for k in 0..max_n {
            let active: Vec<usize> = (0..ns.len()).filter(|&s| ns[s] > k).collect();
            let prev_k: Vec<&Array> = active.iter().map(|&s| &prev[s]).collect();
            let e1 = w1.gather(&concatenate(&prev_k, 0)?)?.astype(Dtype::F32)?; // [A, r]
            let idx: Vec<u32> = active.iter().map(|&s| (starts[s] + k) as u32).collect();
            let uk = u.take(&Array::from_slice(&idx, &[idx.len() as i32])?, 0)?; // [A, V]
            let lk = uk.add(&w2.matmul_t(&e1)?.astype(Dtype::F32)?)?; // [A, V] f32
            let greedy = lk.argmax(-1, false)?.astype(Dtype::U32)?; // [A]
            let mut drawn = Vec::with_capacity(active.len());
            for (j, &s) in active.iter().enumerate() {
                let j = j as i32;
                let tok = match sampling[s].is_greedy() {
                    true => greedy.slice_axis(0, j, j + 1)?,
                    false => {
                        let row = lk.slice_axis(0, j, j + 1)?;
                        match sampling[s].draw_at(&row, uniforms[s].as_ref(), k)? {
                            Some((t, q)) => {
                                qs[s].push(q);
                                t
                            }
                            None => greedy.slice_axis(0, j, j + 1)?,
                        }
                    }
                }; // [1]
                prev[s] = tok.clone();
                drawn.push(tok);
                order.push((s, k));
            }
            toks_k.push(concatenate(&drawn.iter().collect::<Vec<_>>(), 0)?);
            logits_k.push(lk);
            e1_k.push(e1);
        }
        // Back to request-major order: request s's rows at starts[s]..starts[s]+n_s.
        let mut perm = vec![0u32; total];
        for (row, &(s, k)) in order.iter().enumerate() {
            perm[starts[s] + k] = row as u32;
        }
        let perm = Array::from_slice(&perm, &[total as i32])?;
        let cat = |v: &[Array]| -> Result<Array> { Ok(concatenate(&v.iter().collect::<Vec<_>>(), 0)?.take(&perm, 0)?) };
        Ok((Walk { tokens: cat(&toks_k)?, logits: cat(&logits_k)?, e1: cat(&e1_k)? }, qs))
    }

    /// Projects the rows every drafter of `group` has committed since its last proposal into
    /// its context, several drafters' rows in one projection (each row's projection reads only
    /// that row). A projection holds at most the row kernels' bound of rows (more than that
    /// only for one drafter's own long backlog), so a row gets the bits it gets projected alone.
    fn project_unprojected(&self, group: &mut [&mut DSparkDrafter]) -> Result<()> {
        let bound = mlx_core::blas::ROW_LINEAR_MAX_ROWS;
        let mut batch: Vec<usize> = Vec::new();
        let mut rows = 0;
        for s in 0..=group.len() {
            let k = group.get(s).map_or(0, |d| d.unprojected_len);
            let end = s == group.len();
            if !batch.is_empty() && (end || rows + k > bound) {
                self.project_batch(group, &batch)?;
                batch.clear();
                rows = 0;
            }
            if !end && k > 0 {
                batch.push(s);
                rows += k;
            }
        }
        Ok(())
    }

    /// [`Self::project_unprojected`] for the drafters `owners` of `group`, in one projection.
    fn project_batch(&self, group: &mut [&mut DSparkDrafter], owners: &[usize]) -> Result<()> {
        let rows: Vec<&Array> = owners.iter().flat_map(|&s| group[s].unprojected.iter()).collect();
        let all = concatenate(&rows, 1)?; // [1, Σk, m·H]
        let kv = self.project_context(&all)?; // per layer [1, h, Σk, hd]
        let mut start = 0i32;
        for &s in owners {
            let d = &mut *group[s];
            let k = d.unprojected_len as i32;
            let part = if owners.len() == 1 {
                kv.clone()
            } else {
                kv.iter()
                    .map(|l| {
                        Ok(LayerKv { k: l.k.slice_axis(2, start, start + k)?, v: l.v.slice_axis(2, start, start + k)? })
                    })
                    .collect::<Result<Vec<_>>>()?
            };
            let ctx = d.ctx.as_mut().ok_or_else(|| Error::Contract("dspark: commit before reset".into()))?;
            ctx.append(part, k as usize)?;
            d.unprojected.clear();
            d.unprojected_len = 0;
            start += k;
        }
        Ok(())
    }

    /// Whether `other` shares this drafter's weights (a fork of the same loaded drafter), so
    /// their proposals can run in one batched forward.
    pub fn shares_weights(&self, other: &DSparkDrafter) -> bool {
        Rc::ptr_eq(&self.w, &other.w)
    }

    /// This drafter's weights and settings without its parameter map or context (what a
    /// forward reads).
    fn shell(&self) -> DSparkDrafter {
        self.fork_with_params(false)
    }

    fn fork_inner(&self) -> DSparkDrafter {
        self.fork_with_params(true)
    }

    fn fork_with_params(&self, params: bool) -> DSparkDrafter {
        DSparkDrafter {
            cfg: self.cfg.clone(),
            dims: self.dims.clone(),
            target_id: self.target_id.clone(),
            taps: self.taps.clone(),
            w: Rc::clone(&self.w),
            params: if params { self.params.clone() } else { BTreeMap::new() },
            ctx: None,
            unprojected: Vec::new(),
            unprojected_len: 0,
        }
    }
}

/// Each anchor of `[R]` as its own `[1]`.
fn anchors_split(anchors: &Array, r: usize) -> Result<Vec<Array>> {
    (0..r as i32).map(|s| Ok(anchors.slice_axis(0, s, s + 1)?)).collect()
}

/// Proposals for several requests in one batched forward: `group[s]` drafts for `reqs[s]`.
/// The drafters must be forks of one ([`Drafter::fork`]); each keeps its own context. Every
/// request's proposal is bit-identical to the one its drafter makes alone (the products run
/// on row-invariant kernels while `R·γ` stays within their bound; attention and the Markov
/// walk read only the request's own rows).
pub fn propose_batch(group: &mut [&mut DSparkDrafter], reqs: Vec<DraftRequest<'_>>) -> Result<Vec<Proposal>> {
    DSparkDrafter::propose_group(group, reqs)
}

/// Each request's block attending bidirectionally over its own `[context; block]` // q
/// `[R, h, γ, hd]`, `kvs[s]` (`[1, h, L_s+γ, hd]`, same) -> `[R, h, γ, hd]`. On the CPU in f32 it
/// runs as mlx-core's single-query row kernel, every row over its request's keys in one node:
/// MLX's CPU attention evaluates its softmax one exponential at a time (~12 ns each), which
/// made a round after 8,192 context rows 1.4× dearer than after 64.
fn block_attention(q: &Array, kvs: &[(Array, Array)], scale: f32) -> Result<Array> {
    let (r, h, g, hd) = (q.dim(0)?, q.dim(1)?, q.dim(2)?, q.dim(3)?);
    if !row_kernels_for(q)? {
        // No mask: the block attends bidirectionally.
        let outs = kvs
            .iter()
            .enumerate()
            .map(|(s, (k, v))| {
                let qs = q.slice_axis(0, s as i32, s as i32 + 1)?;
                Ok(fast::scaled_dot_product_attention(&qs, k, v, scale, fast::Mask::None)?)
            })
            .collect::<Result<Vec<_>>>()?;
        return Ok(concatenate(&outs.iter().collect::<Vec<_>>(), 0)?);
    }
    // Rows request after request, each over its request's keys and values (read in place).
    let rows_q = q.transpose(&[1, 0, 2, 3])?.reshape(&[1, h, r * g, hd])?; // [1, h, R·γ, hd]
    let mut rows = Vec::with_capacity((r * g) as usize);
    for (k, v) in kvs {
        let (k, v) = (k.astype(Dtype::F32)?, v.astype(Dtype::F32)?);
        rows.extend((0..g).map(|_| (k.clone(), v.clone())));
    }
    let a = mlx_core::blas::row_attention(&rows_q, &rows, scale)?; // [1, h, R·γ, hd]
    Ok(a.reshape(&[h, r, g, hd])?.transpose(&[1, 0, 2, 3])?)
}

impl Drafter for DSparkDrafter {
    fn name(&self) -> String {
        format!("dspark (γ={}, {} layers, d={})", self.cfg.gamma, self.cfg.n_layers, self.cfg.d_draft)
    }

    fn gamma(&self) -> usize {
        self.cfg.gamma
    }

    fn taps(&self) -> TapSet {
        self.taps.clone()
    }

    fn has_confidence(&self) -> bool {
        true
    }

    fn thresholds(&self) -> Option<Vec<f32>> {
        self.cfg.sts.as_ref().map(|s| s.thresholds.clone())
    }

    fn sts(&self, greedy: bool) -> Option<crate::calibration::sts::Sts> {
        self.cfg.sts.as_ref().and_then(|s| s.sts_for(greedy)).map(super::config::StsFit::sts)
    }

    fn reset(&mut self, ctx: Option<&Array>, len: usize) -> Result<()> {
        self.ctx = None;
        self.unprojected.clear();
        self.unprojected_len = 0;
        let rows = ctx.ok_or_else(|| Error::Contract("dspark needs the tapped prompt context".into()))?;
        // The whole context, or with a window at least its last `w` rows.
        let given = rows.dim(1)?.max(0) as usize;
        let least = self.cfg.ctx_window.map_or(len, |w| w.min(len));
        if given > len || given < least {
            return Err(Error::Contract(format!(
                "context has {:?} rows, expected {}",
                rows.shape()?,
                if least == len { format!("{len}") } else { format!("{least} to {len}") }
            )));
        }
        let mut ctx = ContextCache::after(self.w.layers.len(), len - given);
        if given > 0 {
            ctx.append(self.project_context(rows)?, given)?;
        }
        self.ctx = Some(ctx);
        Ok(())
    }

    fn context_len(&self) -> usize {
        self.ctx.as_ref().map_or(0, ContextCache::len) + self.unprojected_len
    }

    fn propose(&mut self, req: DraftRequest<'_>) -> Result<Proposal> {
        let mut one = DSparkDrafter::propose_group(&mut [self], vec![req])?;
        one.pop().ok_or_else(|| Error::Contract("dspark: a batch of one gave no proposal".into()))
    }

    fn fork(&self) -> Option<Box<dyn Drafter>> {
        Some(Box::new(self.fork_inner()))
    }

    fn as_dspark(&mut self) -> Option<&mut DSparkDrafter> {
        Some(self)
    }

    fn commit(&mut self, rows: Option<&Array>, k: usize) -> Result<()> {
        let rows = rows.ok_or_else(|| Error::Contract("dspark commit needs the tapped rows".into()))?;
        if rows.dim(1)? != k as i32 {
            return Err(Error::Contract(format!("commit of {k} rows got {:?}", rows.shape()?)));
        }
        if self.ctx.is_none() {
            return Err(Error::Contract("dspark: commit before reset".into()));
        }
        if k > 0 {
            self.unprojected.push(rows.clone());
            self.unprojected_len += k;
        }
        Ok(())
    }
}
