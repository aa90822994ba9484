//! One writer per output directory: `regen` and `train` hold `DIR/.lock` (the writer's pid)
//! while they write, so a second run on the same directory is refused instead of interleaving
//! shards or checkpoints. A lock whose process is gone (Linux: no `/proc/PID`) is taken over.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The lock file's name inside the directory it guards.
pub const LOCK_FILE: &str = ".lock";

/// Held while a run writes to a directory; dropping it removes the lock file.
#[derive(Debug)]
pub struct DirLock {
    path: PathBuf,
}

impl DirLock {
    /// Creates `dir` if needed and takes its lock; `what` names the run for the refusal
    /// message ("regen", "train").
    pub fn acquire(dir: &Path, what: &str) -> Result<DirLock> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_path_buf(), source })?;
        let path = dir.join(LOCK_FILE);
        for _ in 0..2 {
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    writeln!(f, "{}", std::process::id()).map_err(|source| Error::Io { path: path.clone(), source })?;
                    return Ok(DirLock { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse::<u32>().ok());
                    if holder.is_some_and(is_alive) {
                        return Err(Error::Invalid {
                            what: dir.display().to_string(),
                            detail: format!(
                                "another {what} (pid {}) is writing to this directory; wait for it, or delete {} \
                                 if that process is not a dspark run",
                                holder.unwrap_or(0),
                                path.display()
                            ),
                        });
                    }
                    // Stale (its process is gone) or unreadable: take it over.
                    std::fs::remove_file(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
                }
                Err(source) => return Err(Error::Io { path, source }),
            }
        }
        Err(Error::Invalid { what: path.display().to_string(), detail: "could not take the lock".into() })
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether a process with this pid exists (Linux); elsewhere assume it does (refuse, never
/// take over a lock that might be live).
fn is_alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new(&format!("/proc/{pid}")).exists()
    } else {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_writer_is_refused_and_stale_locks_are_taken_over() {
        let dir = std::env::temp_dir().join(format!("dspark-lock-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let held = DirLock::acquire(&dir, "regen").unwrap();
        let e = DirLock::acquire(&dir, "train").unwrap_err().to_string();
        assert!(e.contains("another train") && e.contains(&std::process::id().to_string()), "{e}");
        drop(held);
        assert!(!dir.join(LOCK_FILE).exists(), "dropping the lock removes the file");
        // A lock left by a process that no longer exists (pid beyond Linux's pid_max).
        std::fs::write(dir.join(LOCK_FILE), "4194305\n").unwrap();
        let taken = DirLock::acquire(&dir, "regen");
        if cfg!(target_os = "linux") {
            assert!(taken.is_ok(), "a stale lock is taken over");
        }
        drop(taken);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
