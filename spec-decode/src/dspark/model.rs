//! The DSpark drafter (spec-decode.md §10, variant "dspark"): a parallel DFlash backbone over the
//! block `[anchor, γ−1 mask slots]` whose layers attend bidirectionally over the projected
//! multi-layer target context H_ctx = RMSNorm(W_c · taps) plus the block, then a Markov head
//! (B_k = W1[x_{k−1}]·W2) and a confidence head (c_k = σ(w·[h_k; W1[x_{k−1}]] + b)); the target's
//! own LM head turns the backbone output into logits.
//!
//! Context K/V are cached per layer: every op on a context row (W_c, RMSNorm, the layer's norm
//! and K/V projections) is per-row, so projecting committed rows once and appending is exact and
//! a round never re-projects the whole context.
//!
//! Weights are f32 and stored [in, out] (used as `x @ W`). Inference is semi-autoregressive:
//! one backbone pass, then the Markov walk on the device; greedy drafting needs no host read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gemma4::checkpoint::{write_json, StagedDir};
use gemma4::{TapSet, TextConfig};
use mlx_core::random::{self, KeyChain};
use mlx_core::{concatenate, fast, gelu_approx, Array, Dtype};

use super::config::{check_target, read_descriptor, target_id, DSparkConfig, Descriptor, Dims, KIND};
use crate::drafter::{DraftRequest, DraftSampling, Drafter, Proposal};
use crate::error::{Error, Result};

struct Layer {
    attn_norm: Array,
    q: Array,
    k: Array,
    v: Array,
    o: Array,
    ff_norm: Array,
    gate: Array,
    up: Array,
    down: Array,
}

/// Cached context keys and values of one layer // [1, heads, L, hd]
#[derive(Clone)]
struct LayerCtx {
    k: Array,
    v: Array,
}

/// A DSpark drafter bound to one target.
pub struct DSparkDrafter {
    cfg: DSparkConfig,
    dims: Dims,
    target_id: String,
    taps: TapSet,
    layers: Vec<Layer>,
    params: BTreeMap<String, Array>,
    ctx: Option<Vec<LayerCtx>>,
    ctx_len: usize,
}

fn p<'a>(params: &'a BTreeMap<String, Array>, name: &str) -> Result<&'a Array> {
    params.get(name).ok_or_else(|| Error::Contract(format!("dspark parameter {name} missing")))
}

impl DSparkDrafter {
    fn from_params(cfg: DSparkConfig, dims: Dims, target_id: String, taps: TapSet, params: BTreeMap<String, Array>) -> Result<Self> {
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let g = |n: &str| p(&params, &format!("bb.{i}.{n}")).cloned();
                Ok(Layer {
                    attn_norm: g("attn_norm")?,
                    q: g("q")?,
                    k: g("k")?,
                    v: g("v")?,
                    o: g("o")?,
                    ff_norm: g("ff_norm")?,
                    gate: g("gate")?,
                    up: g("up")?,
                    down: g("down")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DSparkDrafter { cfg, dims, target_id, taps, layers, params, ctx: None, ctx_len: 0 })
    }

    /// A freshly initialised drafter for `target` (spec §10.3: norms 1, matrices N(0, 0.02²),
    /// `markov.w2`, `conf.w`, `conf.b` zero). `random_heads` also draws the Markov and
    /// confidence heads at random, so untrained drafters exercise those paths in tests.
    pub fn init(cfg: DSparkConfig, target: &TextConfig, model_name: &str, seed: u64, random_heads: bool) -> Result<Self> {
        let dims = Dims { hidden_size: target.hidden_size, vocab_size: target.vocab_size, eps: target.rms_norm_eps };
        cfg.validate(Path::new("<new drafter>"))?;
        let mut keys = KeyChain::new(seed)?;
        let mut params = BTreeMap::new();
        for name in cfg.param_names() {
            let shape = cfg.param_shape(&name, &dims).ok_or_else(|| Error::Contract(format!("no shape for {name}")))?;
            let key = keys.next_key()?;
            let is_norm = name.ends_with("norm");
            let zero = matches!(name.as_str(), "markov.w2" | "conf.w" | "conf.b") && !random_heads;
            let a = if is_norm {
                Array::ones(&shape, Dtype::F32)?
            } else if zero || name == "conf.b" {
                Array::zeros(&shape, Dtype::F32)?
            } else {
                let std = if random_heads && name == "conf.w" { 0.5 } else { 0.02 };
                random::normal(&shape, Dtype::F32, 0.0, std, &key)?
            };
            params.insert(name, a);
        }
        let taps = cfg.tap_set(target.num_hidden_layers);
        Self::from_params(cfg, dims, target_id(model_name, target), taps, params)
    }

    /// Loads `dir` (dspark.json + model*.safetensors) for `target`.
    pub fn load(dir: &Path, target: &TextConfig) -> Result<Self> {
        let d = read_descriptor(dir)?;
        check_target(&d, target)?;
        let raw = gemma4::weights::load_raw(dir)?;
        let mut params = BTreeMap::new();
        for name in d.config.param_names() {
            let a = raw.get(&name).ok_or_else(|| Error::checkpoint(dir, format!("missing tensor {name:?}")))?;
            let want = d.config.param_shape(&name, &d.dims).unwrap_or_default();
            if a.shape() != want {
                return Err(Error::checkpoint(dir, format!("tensor {name:?} has shape {:?}, expected {want:?}", a.shape())));
            }
            params.insert(name, a.astype(Dtype::F32)?);
        }
        let taps = d.config.tap_set(target.num_hidden_layers);
        Self::from_params(d.config, d.dims, d.target_id, taps, params)
    }

    /// Writes the checkpoint (dspark.json + model.safetensors) atomically.
    pub fn save(&self, dest: &Path, force: bool) -> Result<PathBuf> {
        let staged = StagedDir::new(dest, force)?;
        let names = self.cfg.param_names();
        let tensors: Vec<(&str, &Array)> = names.iter().filter_map(|n| self.params.get(n).map(|a| (n.as_str(), a))).collect();
        let meta = [("format".to_string(), "mlx".to_string())].into_iter().collect();
        mlx_core::save_safetensors(&staged.path().join("model.safetensors"), tensors, &meta)?;
        let d = Descriptor {
            kind: KIND.into(),
            variant: Some("dspark".into()),
            version: 1,
            target_id: self.target_id.clone(),
            config: self.cfg.clone(),
            dims: self.dims.clone(),
            param_names: names,
        };
        let v = serde_json::to_value(&d).map_err(|e| Error::Contract(e.to_string()))?;
        write_json(&staged.path().join("dspark.json"), &v)?;
        Ok(staged.commit()?)
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
        Ok(fast::rms_norm(x, Some(w), self.dims.eps)?)
    }

    fn heads(&self, x: &Array) -> Result<Array> {
        // [1, L, D] -> [1, heads, L, hd]
        let l = x.dim(1).unwrap_or(0);
        let hd = (self.cfg.d_draft / self.cfg.n_heads) as i32;
        Ok(x.reshape(&[1, l, self.cfg.n_heads as i32, hd])?.transpose(&[0, 2, 1, 3])?)
    }

    /// Projects tapped rows into every layer's context K/V // [1, L, m·H] -> per layer [1, h, L, hd]
    fn project_context(&self, rows: &Array) -> Result<Vec<LayerCtx>> {
        let x = rows.astype(Dtype::F32)?.matmul(p(&self.params, "W_c")?)?;
        let hctx = self.rms(&x, p(&self.params, "ctx_norm")?)?; // [1, L, D]
        self.layers
            .iter()
            .map(|l| {
                let nc = self.rms(&hctx, &l.attn_norm)?;
                Ok(LayerCtx { k: self.heads(&nc.matmul(&l.k)?)?, v: self.heads(&nc.matmul(&l.v)?)? })
            })
            .collect()
    }

    /// The backbone over the block // anchor [1] -> block hidden [1, γ, D]
    fn backbone(&self, target: &gemma4::Model, anchor: &Array) -> Result<Array> {
        let g = self.cfg.gamma as i32;
        let emb = target.embed_raw(&anchor.reshape(&[1, 1])?)?.astype(Dtype::F32)?; // [1, 1, H]
        let pos = p(&self.params, "block_pos")?;
        let row0 = emb.matmul(p(&self.params, "tok_proj")?)?.add(&pos.slice_axis(0, 0, 1)?)?;
        let mut h = if g > 1 {
            let masks = p(&self.params, "mask_emb")?.add(&pos.slice_axis(0, 1, g)?)?.expand_dims(0)?;
            concatenate(&[&row0, &masks], 1)?
        } else {
            row0
        }; // [1, γ, D]
        let ctx = self.ctx.as_ref().ok_or_else(|| Error::Contract("dspark: propose before reset".into()))?;
        let scale = ((self.cfg.d_draft / self.cfg.n_heads) as f32).powf(-0.5);
        for (l, c) in self.layers.iter().zip(ctx) {
            let nd = self.rms(&h, &l.attn_norm)?;
            let q = self.heads(&nd.matmul(&l.q)?)?;
            let k = concatenate(&[&c.k, &self.heads(&nd.matmul(&l.k)?)?], 2)?;
            let v = concatenate(&[&c.v, &self.heads(&nd.matmul(&l.v)?)?], 2)?;
            let a = fast::scaled_dot_product_attention(&q, &k, &v, scale, fast::Mask::None)?; // no mask: bidirectional
            let a = a.transpose(&[0, 2, 1, 3])?.reshape(&[1, g, -1])?.matmul(&l.o)?;
            h = h.add(&a)?;
            let f = self.rms(&h, &l.ff_norm)?;
            let ff = gelu_approx(&f.matmul(&l.gate)?)?.multiply(&f.matmul(&l.up)?)?.matmul(&l.down)?;
            h = h.add(&ff)?;
        }
        self.rms(&h, p(&self.params, "out_norm")?)
    }
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

    fn thresholds(&self) -> Option<Vec<f32>> {
        self.cfg.sts.as_ref().map(|s| s.thresholds.clone())
    }

    fn reset(&mut self, ctx: Option<&Array>, len: usize) -> Result<()> {
        let rows = ctx.ok_or_else(|| Error::Contract("dspark needs the tapped prompt context".into()))?;
        if rows.dim(1) != Some(len as i32) {
            return Err(Error::Contract(format!("context has {:?} rows, expected {len}", rows.shape())));
        }
        self.ctx = Some(self.project_context(rows)?);
        self.ctx_len = len;
        Ok(())
    }

    fn context_len(&self) -> usize {
        self.ctx_len
    }

    fn propose(&mut self, req: DraftRequest<'_>) -> Result<Proposal> {
        let n = req.max_drafts.clamp(1, self.cfg.gamma);
        let block = self.backbone(req.target, req.anchor)?; // [1, γ, D]
        let to_target = block.matmul(p(&self.params, "out_proj")?)?.astype(req.target.dtype())?;
        let u = req.target.logits_from_hidden(&to_target)?.astype(Dtype::F32)?.squeeze(0)?; // [γ, V]
        let (w1, w2) = (p(&self.params, "markov.w1")?, p(&self.params, "markov.w2")?);
        let (cw, cb) = (p(&self.params, "conf.w")?, p(&self.params, "conf.b")?);
        let block = block.squeeze(0)?; // [γ, D]
        let mut prev = req.anchor.reshape(&[1])?;
        let mut sampling = req.sampling;
        let (mut tokens, mut logits, mut conf) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for k in 0..n as i32 {
            let e1 = w1.take(&prev, 0)?; // [1, r]
            let lk = u.slice_axis(0, k, k + 1)?.add(&e1.matmul(w2)?)?; // [1, V] f32
            let tok = match &mut sampling {
                DraftSampling::Greedy => lk.argmax(-1, false)?,
                DraftSampling::Sample { cfg, keys } => crate::probs::sample(&lk, cfg, &keys.next_key()?)?,
            }; // [1]
            let hk = block.slice_axis(0, k, k + 1)?;
            let c = concatenate(&[&hk, &e1], -1)?.matmul(cw)?.add(cb)?.sigmoid()?.reshape(&[1])?;
            tokens.push(tok.astype(Dtype::U32)?);
            logits.push(lk);
            conf.push(c);
            prev = tokens[k as usize].clone();
        }
        let cat = |v: &[Array]| -> Result<Array> {
            let r: Vec<&Array> = v.iter().collect();
            Ok(concatenate(&r, 0)?)
        };
        Ok(Proposal { tokens: cat(&tokens)?, logits: Some(cat(&logits)?), confidence: Some(cat(&conf)?) })
    }

    fn commit(&mut self, rows: Option<&Array>, k: usize) -> Result<()> {
        let rows = rows.ok_or_else(|| Error::Contract("dspark commit needs the tapped rows".into()))?;
        if rows.dim(1) != Some(k as i32) {
            return Err(Error::Contract(format!("commit of {k} rows got {:?}", rows.shape())));
        }
        let new = self.project_context(rows)?;
        let old = self.ctx.take().ok_or_else(|| Error::Contract("dspark: commit before reset".into()))?;
        let merged = old
            .into_iter()
            .zip(new)
            .map(|(o, n)| Ok(LayerCtx { k: concatenate(&[&o.k, &n.k], 2)?, v: concatenate(&[&o.v, &n.v], 2)? }))
            .collect::<Result<Vec<_>>>()?;
        self.ctx = Some(merged);
        self.ctx_len += k;
        Ok(())
    }
}
