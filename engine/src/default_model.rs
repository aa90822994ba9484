//! The embedded default: a small Gemma-4 trained by this project on the Python standard
//! library's source, with its byte-level BPE tokenizer and its trained DSpark drafter
//! (`cargo xtask train-default` rebuilds all three; `engine/default/recipe.json` records how).
//! The files are compiled into the binaries (`dspark`, `dspark-serve`) and written to a cache
//! directory on first use, so both work on a fresh machine with no downloads.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use gemma4::checkpoint::StagedDir;

use crate::error::{Error, Result};

/// Bumped when the default's contents change, so stale caches are rebuilt.
const VERSION: u32 = 2;

/// One embedded file: its name and bytes.
type Embedded = (&'static str, &'static [u8]);

/// The target checkpoint (bf16 weights, tokenizer, PSF notice, training report).
const MODEL: [Embedded; 6] = [
    ("config.json", include_bytes!("../default/model/config.json")),
    ("model.safetensors", include_bytes!("../default/model/model.safetensors")),
    ("tokenizer.json", include_bytes!("../default/model/tokenizer.json")),
    ("tokenizer_config.json", include_bytes!("../default/model/tokenizer_config.json")),
    ("LICENSE-PSF.txt", include_bytes!("../default/model/LICENSE-PSF.txt")),
    ("train_report.json", include_bytes!("../default/model/train_report.json")),
];

/// The DSpark drafter trained for it.
const DRAFTER: [Embedded; 2] = [
    ("dspark.json", include_bytes!("../default/drafter/dspark.json")),
    ("model.safetensors", include_bytes!("../default/drafter/model.safetensors")),
];

/// Bytes of the embedded default (target and drafter).
pub fn embedded_bytes() -> (usize, usize) {
    let sum = |files: &[Embedded]| files.iter().map(|f| f.1.len()).sum();
    (sum(&MODEL), sum(&DRAFTER))
}

/// Whether `dir` holds exactly the embedded files (compared by length: a cache written by
/// another version of the default differs in its weights' size or is under another name).
fn is_current(dir: &Path, files: &[Embedded]) -> bool {
    files.iter().all(|(name, bytes)| std::fs::metadata(dir.join(name)).is_ok_and(|m| m.len() == bytes.len() as u64))
}

/// Writes `files` into `dir` (whole, through a staging directory) unless they are there.
fn materialize(dir: PathBuf, files: &[Embedded], what: &str, force: bool) -> Result<PathBuf> {
    if !force && is_current(&dir, files) {
        return Ok(dir);
    }
    // Both front ends print this notice: writing 17 MB is worth a line.
    eprintln!("dspark: writing the embedded default {what} to {} (once)", dir.display());
    let staged = StagedDir::new(&dir, true)?;
    for (name, bytes) in files {
        let path = staged.path().join(name);
        std::fs::write(&path, bytes).map_err(|source| Error::Io { path: path.clone(), source })?;
    }
    Ok(staged.commit()?)
}

/// The default checkpoint's directory, written if missing (or if `force`).
pub fn ensure(force: bool) -> Result<PathBuf> {
    materialize(home().join(format!("default-model-v{VERSION}")), &MODEL, "model", force)
}

/// The default drafter's directory, written if missing (or if `force`).
pub fn ensure_drafter(force: bool) -> Result<PathBuf> {
    materialize(home().join(format!("default-drafter-v{VERSION}")), &DRAFTER, "drafter", force)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
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

    #[test]
    fn the_embedded_files_are_written_once_and_rewritten_when_damaged() {
        let dir = std::env::temp_dir().join(format!("dspark-default-{}", std::process::id()));
        let files: [Embedded; 2] = [("a.json", b"{}"), ("w.bin", b"0123456789")];
        let d = materialize(dir.clone(), &files, "test", false).unwrap();
        assert_eq!(std::fs::read(d.join("w.bin")).unwrap(), b"0123456789");
        assert!(is_current(&d, &files));
        // A truncated file (a killed copy, an older default) is noticed and rewritten.
        std::fs::write(d.join("w.bin"), b"01").unwrap();
        assert!(!is_current(&d, &files));
        materialize(dir.clone(), &files, "test", false).unwrap();
        assert_eq!(std::fs::read(d.join("w.bin")).unwrap(), b"0123456789");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_embedded_default_is_a_loadable_pair() {
        let dir = std::env::temp_dir().join(format!("dspark-default-pair-{}", std::process::id()));
        let m = materialize(dir.join("model"), &MODEL, "model", false).unwrap();
        let d = materialize(dir.join("drafter"), &DRAFTER, "drafter", false).unwrap();
        let model = gemma4::Model::load(&m).unwrap();
        let drafter = spec_decode::load_drafter(&d, model.config()).unwrap();
        assert!(drafter.gamma() >= 1);
        let tok = gemma4::tokenizer::Tokenizer::from_dir(&m).unwrap();
        assert!(tok.encode("def fibonacci(n):", true).unwrap().len() > 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
