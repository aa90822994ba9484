//! The training corpus of the embedded default: the Python standard library's source, which
//! every machine with Python 3 has (`sysconfig.get_paths()["stdlib"]`, PSF license). Files are
//! split into train / validation / test by a hash of their path relative to the library root,
//! so the split does not depend on the machine, the order files are listed in, or their count.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// Which part of the corpus a file belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Split {
    /// About 90% of the files: trained on.
    Train,
    /// About 5%: evaluated on during training.
    Validation,
    /// About 5%: held out for the final report.
    Test,
}

/// FNV-1a (64-bit) of the path's bytes: stable across platforms and Rust versions.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// The split of a file by its `/`-separated path relative to the corpus root: 90% train, 5%
/// validation, 5% test.
pub fn split_of(relative: &str) -> Split {
    match fnv1a(relative.as_bytes()) % 100 {
        0..=89 => Split::Train,
        90..=94 => Split::Validation,
        _ => Split::Test,
    }
}

/// One source file of the corpus.
#[derive(Clone, Debug)]
pub struct SourceFile {
    /// Path relative to the corpus root, `/`-separated.
    pub relative: String,
    /// Path on disk: the corpus root joined with `relative`.
    pub path: PathBuf,
    /// Which split the file belongs to.
    pub split: Split,
}

/// The standard library directory of `python` (`python3` by default).
pub fn stdlib_dir(python: Option<&str>) -> Result<PathBuf> {
    let py = python.unwrap_or("python3");
    let out = Command::new(py)
        .args(["-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"])
        .output()
        .map_err(|e| Error::Invalid { what: py.into(), detail: format!("could not run it: {e}") })?;
    if !out.status.success() {
        return Err(Error::Invalid {
            what: py.into(),
            detail: format!("asking for sysconfig's stdlib failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
        });
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !dir.is_dir() {
        return Err(Error::Invalid {
            what: py.into(),
            detail: format!("its stdlib {} is not a directory", dir.display()),
        });
    }
    Ok(dir)
}

/// Every `.py` file under `root` (skipping `site-packages`, caches and test data directories
/// holding non-UTF-8 or generated files), sorted by relative path, with its split.
pub fn list_sources(root: &Path) -> Result<Vec<SourceFile>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| Error::Io { path: dir.clone(), source })?;
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !matches!(name.as_str(), "site-packages" | "__pycache__" | "dist-packages") && !name.starts_with('.')
                {
                    stack.push(p);
                }
            } else if name.ends_with(".py") {
                let relative = p
                    .strip_prefix(root)
                    .unwrap_or(&p)
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                let split = split_of(&relative);
                out.push(SourceFile { relative, path: p, split });
            }
        }
    }
    out.sort_by(|a, b| a.relative.cmp(&b.relative));
    Ok(out)
}

/// The UTF-8 text of the files of one split (files that are not UTF-8 are skipped), in order.
pub fn read_split(files: &[SourceFile], split: Split) -> Vec<(String, String)> {
    files
        .iter()
        .filter(|f| f.split == split)
        .filter_map(|f| std::fs::read_to_string(&f.path).ok().map(|t| (f.relative.clone(), t)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_is_a_function_of_the_path() {
        assert_eq!(split_of("json/decoder.py"), split_of("json/decoder.py"));
        let n = 5000;
        let counts = (0..n).fold([0usize; 3], |mut c, i| {
            c[split_of(&format!("pkg{}/mod{i}.py", i % 7)) as usize] += 1;
            c
        });
        assert!((4300..4700).contains(&counts[0]), "train {counts:?}");
        assert!((150..350).contains(&counts[1]) && (150..350).contains(&counts[2]), "{counts:?}");
    }

    #[test]
    fn lists_the_stdlib_when_python_is_there() {
        let Ok(dir) = stdlib_dir(None) else {
            panic!("python3 is required (the project's corpus is its standard library)");
        };
        let files = list_sources(&dir).unwrap();
        assert!(files.len() > 100, "{} .py files under {}", files.len(), dir.display());
        assert!(files.iter().any(|f| f.relative == "json/decoder.py"));
        assert!(files.windows(2).all(|w| w[0].relative < w[1].relative), "sorted");
        for s in [Split::Train, Split::Validation, Split::Test] {
            assert!(files.iter().any(|f| f.split == s), "every split is populated");
        }
    }
}
