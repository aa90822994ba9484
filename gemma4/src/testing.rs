//! Scratch directories for tests of every crate (feature `testing`): one root per process
//! under the system temp directory, roots of finished processes removed on first use, and
//! directories that delete themselves when dropped.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const ROOT_PREFIX: &str = "dspark-tests-";

/// This process's scratch root, `<temp>/dspark-tests-PID` (created on first use).
pub fn scratch_root() -> &'static PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let base = std::env::temp_dir();
        let me = std::process::id();
        if Path::new("/proc/self").exists() {
            for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let pid = name.strip_prefix(ROOT_PREFIX).and_then(|p| p.parse::<u32>().ok());
                if pid.is_some_and(|p| p != me && !Path::new(&format!("/proc/{p}")).exists()) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let root = base.join(format!("{ROOT_PREFIX}{me}"));
        let _ = std::fs::create_dir_all(&root);
        root
    })
}

/// A path under the root, removed first if it exists; kept until the process ends (for
/// checkpoints written once and shared by the tests of a binary).
pub fn scratch(name: &str) -> PathBuf {
    let p = scratch_root().join(name);
    let _ = std::fs::remove_dir_all(&p);
    p
}

/// A scratch directory that is removed when dropped.
#[derive(Debug)]
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// The path, not created.
    pub fn new(name: &str) -> Scratch {
        Scratch(scratch(name))
    }

    /// The directory, created and canonical (so path comparisons hold).
    pub fn create(name: &str) -> Scratch {
        let p = scratch(name);
        let _ = std::fs::create_dir_all(&p);
        Scratch(p.canonicalize().unwrap_or(p))
    }

    /// Names of the entries in the directory, sorted (to spot leftovers of staging).
    pub fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh copy of the flat directory `src` at scratch `name`.
pub fn copy_of(src: &Path, name: &str) -> std::io::Result<Scratch> {
    let dst = Scratch::new(name);
    std::fs::create_dir_all(&*dst)?;
    for e in std::fs::read_dir(src)? {
        let p = e?.path();
        if let Some(file) = p.file_name() {
            std::fs::copy(&p, dst.join(file))?;
        }
    }
    Ok(dst)
}
