//! The embedded default: a small random-weight Gemma-4 checkpoint (tiny config A: PLE, KV
//! sharing, sliding + full layers, partial RoPE) with a word-level tokenizer, generated on first
//! use and cached, so `dspark generate` works on a fresh machine with no downloads.

use std::ffi::OsString;
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
    let prompts = fit_prompts(model.config().vocab_size).with_context(|| model_dir.display().to_string())?;
    let d = spec_decode::dspark::fit_bigram_drafter(&model, "dspark-default", &prompts, 96, 4)?;
    Ok(d.save(&dir, true)?)
}

/// The prompts the default drafter is fitted on: 32 of 6 tokens over the ordinary ids of a
/// vocabulary of `vocab` tokens (the first four are special).
pub fn fit_prompts(vocab: usize) -> Result<Vec<Vec<u32>>> {
    let span = u32::try_from(vocab).ok().and_then(|v| v.checked_sub(4)).filter(|&s| s > 0).with_context(|| {
        format!("a vocabulary of {vocab} tokens is too small to fit a drafter to (it needs more than 4)")
    })?;
    Ok((0..32u32).map(|i| (0..6).map(|j| 4 + (i * 31 + j * 17) % span).collect()).collect())
}

/// Where the default lives: `$DSPARK_HOME`, else `$XDG_CACHE_HOME/dspark`, else `~/.cache/dspark`
/// (else the system temporary directory). An empty variable counts as unset.
pub fn home() -> PathBuf {
    home_from(&|name| std::env::var_os(name))
}

/// [`home`] with the environment given as a lookup, so the rules can be tested.
pub fn home_from(var: &dyn Fn(&str) -> Option<OsString>) -> PathBuf {
    let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(h) = set("DSPARK_HOME") {
        return h;
    }
    let cache =
        set("XDG_CACHE_HOME").or_else(|| set("HOME").map(|h| h.join(".cache"))).unwrap_or_else(std::env::temp_dir);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
    }

    #[test]
    fn fit_prompts_need_a_vocabulary_above_the_special_ids() {
        for vocab in [0, 3, 4] {
            let e = fit_prompts(vocab).unwrap_err().to_string();
            assert!(e.contains(&format!("vocabulary of {vocab} tokens")), "{e}");
        }
        let p = fit_prompts(5).unwrap();
        assert!(p.iter().flatten().all(|&t| t == 4), "{p:?}");
        let p = fit_prompts(262_144).unwrap();
        assert_eq!((p.len(), p[0].len()), (32, 6));
        assert!(p.iter().flatten().all(|&t| (4..262_144).contains(&t)));
    }

    #[test]
    fn home_follows_dspark_home_then_xdg_then_home() {
        let all = [("DSPARK_HOME", "/d"), ("XDG_CACHE_HOME", "/x"), ("HOME", "/h")];
        assert_eq!(home_from(&env(&all)), PathBuf::from("/d"));
        assert_eq!(home_from(&env(&all[1..])), PathBuf::from("/x/dspark"));
        assert_eq!(home_from(&env(&all[2..])), PathBuf::from("/h/.cache/dspark"));
        assert_eq!(home_from(&env(&[])), std::env::temp_dir().join("dspark"));
    }

    #[test]
    fn empty_variables_count_as_unset() {
        // An empty DSPARK_HOME used to put the cache in the working directory.
        let vars = [("DSPARK_HOME", ""), ("XDG_CACHE_HOME", ""), ("HOME", "/h")];
        assert_eq!(home_from(&env(&vars)), PathBuf::from("/h/.cache/dspark"));
        let vars = [("DSPARK_HOME", ""), ("HOME", "")];
        assert_eq!(home_from(&env(&vars)), std::env::temp_dir().join("dspark"));
    }
}
