//! A resumable training state: named parameters, AdamW's moments and step, the RNG key, and a
//! JSON blob for the trainer's own bookkeeping (its config, best validation score…). Written as
//! `state.safetensors` + `state.json` into a staging directory that is renamed into place, so a
//! kill mid-write leaves the previous checkpoint intact.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gemma4::checkpoint::{write_json, StagedDir};
use mlx_core::Array;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::adamw::{AdamW, AdamWConfig};
use crate::error::{Error, Result};

const FORMAT: &str = "dspark-train-state";
const VERSION: u32 = 1;

/// Everything a run needs to continue bit for bit.
#[derive(Clone, Debug)]
pub struct TrainState {
    /// Parameter names, in the order of `params` and the optimizer's moments.
    pub names: Vec<String>,
    /// Parameter values.
    pub params: Vec<Array>,
    /// The optimizer with its moments and step count.
    pub opt: AdamW,
    /// The training RNG key (`mlx_core::random::KeyChain` state).
    pub rng: Array,
    /// The trainer's own fields, stored as given.
    pub extra: Value,
}

#[derive(Serialize, Deserialize)]
struct Meta {
    format: String,
    version: u32,
    step: u64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    names: Vec<String>,
    extra: Value,
}

impl TrainState {
    /// Writes `dir` atomically (replacing an existing state only with `force`).
    pub fn save(&self, dir: &Path, force: bool) -> Result<PathBuf> {
        if self.names.len() != self.params.len() || self.params.len() != self.opt.m.len() {
            return Err(Error::Mismatch {
                what: "train state",
                detail: format!(
                    "{} names, {} parameters, {} moments",
                    self.names.len(),
                    self.params.len(),
                    self.opt.m.len()
                ),
            });
        }
        let staged = StagedDir::new(dir, force)?;
        let mut tensors: Vec<(String, &Array)> = Vec::new();
        for (i, n) in self.names.iter().enumerate() {
            tensors.push((format!("param/{n}"), &self.params[i]));
            tensors.push((format!("adam_m/{n}"), &self.opt.m[i]));
            tensors.push((format!("adam_v/{n}"), &self.opt.v[i]));
        }
        tensors.push(("rng".to_string(), &self.rng));
        mlx_core::save_safetensors(
            &staged.path().join("state.safetensors"),
            tensors.iter().map(|(n, a)| (n.as_str(), *a)),
            &BTreeMap::new(),
        )?;
        let c = &self.opt.config;
        let meta = Meta {
            format: FORMAT.into(),
            version: VERSION,
            step: self.opt.step,
            beta1: c.beta1,
            beta2: c.beta2,
            eps: c.eps,
            weight_decay: c.weight_decay,
            names: self.names.clone(),
            extra: self.extra.clone(),
        };
        let v = serde_json::to_value(&meta).map_err(|e| Error::State { path: dir.into(), detail: e.to_string() })?;
        write_json(&staged.path().join("state.json"), &v)?;
        Ok(staged.commit()?)
    }

    /// Reads a state written by [`TrainState::save`].
    pub fn load(dir: &Path) -> Result<TrainState> {
        let json = dir.join("state.json");
        let text = mlx_core::files::read_text(&json, mlx_core::files::JSON_LIMIT)
            .map_err(|source| Error::Io { path: json.clone(), source })?;
        let bad = |detail: String| Error::State { path: json.clone(), detail };
        let meta: Meta = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if meta.format != FORMAT || meta.version != VERSION {
            return Err(bad(format!(
                "format {:?} version {}, expected {FORMAT:?} version {VERSION}",
                meta.format, meta.version
            )));
        }
        let mut tensors = mlx_core::load_safetensors(&dir.join("state.safetensors"))?.tensors;
        let mut take = |key: String| {
            tensors.remove(&key).ok_or_else(|| Error::State {
                path: dir.join("state.safetensors"),
                detail: format!("tensor {key:?} is missing"),
            })
        };
        let (mut params, mut m, mut v) = (Vec::new(), Vec::new(), Vec::new());
        for n in &meta.names {
            params.push(take(format!("param/{n}"))?);
            m.push(take(format!("adam_m/{n}"))?);
            v.push(take(format!("adam_v/{n}"))?);
        }
        let rng = take("rng".to_string())?;
        let config =
            AdamWConfig { beta1: meta.beta1, beta2: meta.beta2, eps: meta.eps, weight_decay: meta.weight_decay };
        Ok(TrainState {
            names: meta.names,
            params,
            opt: AdamW { config, step: meta.step, m, v },
            rng,
            extra: meta.extra,
        })
    }
}
