//! The embedded default: a small random-weight Gemma-4 checkpoint (tiny config A: PLE, KV
//! sharing, sliding + full layers, partial RoPE) with a word-level tokenizer, generated on first
//! use and cached, so `dspark generate` works on a fresh machine with no downloads.

use std::path::PathBuf;

use anyhow::{Context, Result};
use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::tiny_config_a;
use mlx_core::Dtype;

/// Fixed so every machine gets the same default model.
const SEED: u64 = 20261202;
/// Bumped when the default's contents change, so stale caches are rebuilt.
const VERSION: u32 = 1;

/// The default drafter: a DSpark checkpoint whose Markov head is fitted (by counting) to the
/// default model's own greedy continuations, written next to the model on first use.
pub fn ensure_drafter(model_dir: &std::path::Path, force: bool) -> Result<PathBuf> {
    let dir = home().join(format!("default-drafter-v{VERSION}"));
    if !force && dir.join("dspark.json").is_file() {
        return Ok(dir);
    }
    eprintln!("dspark: fitting the embedded default drafter to the default model (once) -> {}", dir.display());
    let model = gemma4::Model::load(model_dir)?;
    let v = model.config().vocab_size as u32;
    let prompts: Vec<Vec<u32>> =
        (0..32u32).map(|i| (0..6).map(|j| 4 + (i * 31 + j * 17) % (v - 4)).collect()).collect();
    let d = spec_decode::dspark::fit_bigram_drafter(&model, "dspark-default", &prompts, 96, 4)?;
    Ok(d.save(&dir, true)?)
}

/// Where the default lives: `$DSPARK_HOME`, else `$XDG_CACHE_HOME/dspark`, else `~/.cache/dspark`.
pub fn home() -> PathBuf {
    if let Some(h) = std::env::var_os("DSPARK_HOME") {
        return PathBuf::from(h);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("dspark")
}

/// The default checkpoint's directory, written if missing (or if `force`).
pub fn ensure(force: bool) -> Result<PathBuf> {
    let dir = home().join(format!("default-model-v{VERSION}"));
    if !force && dir.join("config.json").is_file() && dir.join("tokenizer.json").is_file() {
        return Ok(dir);
    }
    eprintln!("dspark: writing the embedded default checkpoint to {} (once)", dir.display());
    write_random_checkpoint(&dir, &tiny_config_a(), SEED, Dtype::Bf16, 1, true)
        .with_context(|| format!("writing the default checkpoint to {}", dir.display()))
}
