//! One writer per output directory: `regen` and `train` hold an OS file lock on `DIR/.lock`
//! while they write, so a second run on the same directory is refused instead of interleaving
//! shards or checkpoints. The OS drops the lock when its process ends, however it ends, so a
//! killed run never leaves a stale lock behind (on every platform, unlike a pid file). The file
//! holds the writer's pid, for the refusal message only, and stays in place between runs:
//! deleting a lock file can let two later writers lock two different files.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The lock file's name inside the directory it guards.
pub const LOCK_FILE: &str = ".lock";

/// Held while a run writes to a directory; dropping it releases the lock.
#[derive(Debug)]
pub struct DirLock {
    file: File,
    path: PathBuf,
}

impl DirLock {
    /// Creates `dir` if needed and takes its lock; `what` names the run for the refusal
    /// message ("regen", "train").
    pub fn acquire(dir: &Path, what: &str) -> Result<DirLock> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_path_buf(), source })?;
        let path = dir.join(LOCK_FILE);
        let io = |source| Error::Io { path: path.clone(), source };
        let mut file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let who = if holder.is_empty() { String::new() } else { format!(" (pid {holder})") };
                return Err(Error::Invalid {
                    what: dir.display().to_string(),
                    detail: format!("another {what}{who} is writing to this directory; wait for it to finish"),
                });
            }
            Err(TryLockError::Error(source)) => return Err(io(source)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(DirLock { file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // The pid is cleared; the OS lock goes with the file handle.
        let _ = self.file.set_len(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_writer_is_refused_and_a_released_lock_is_taken() {
        let dir = std::env::temp_dir().join(format!("dspark-lock-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let held = DirLock::acquire(&dir, "regen").unwrap();
        let e = DirLock::acquire(&dir, "train").unwrap_err().to_string();
        assert!(e.contains("another train") && e.contains(&std::process::id().to_string()), "{e}");
        drop(held);
        let again = DirLock::acquire(&dir, "regen").expect("a released lock is taken");
        drop(again);
        // A pid left in the file by a killed writer does not hold the directory: only the OS lock
        // does, and it died with its process.
        std::fs::write(dir.join(LOCK_FILE), "4194305\n").unwrap();
        let taken = DirLock::acquire(&dir, "regen").expect("a leftover lock file is no lock");
        assert_eq!(std::fs::read_to_string(taken.path()).unwrap().trim(), std::process::id().to_string());
        drop(taken);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A lock held by another process is refused, and taken once that process has ended.
    #[cfg(unix)]
    #[test]
    fn a_lock_dies_with_its_process() {
        let dir = std::env::temp_dir().join(format!("dspark-lock-proc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let lock = dir.join(LOCK_FILE);
        // flock(1) takes the file's lock and becomes `sleep` (-F: no fork, so killing it ends
        // the only holder).
        let Ok(mut child) = std::process::Command::new("flock").arg("-F").arg(&lock).args(["sleep", "30"]).spawn()
        else {
            panic!("flock(1) (util-linux) is needed for this test");
        };
        let t0 = std::time::Instant::now();
        while DirLock::acquire(&dir, "regen").is_ok() {
            assert!(t0.elapsed().as_secs() < 10, "the other process never took the lock");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(DirLock::acquire(&dir, "regen").is_ok(), "the lock is free once its process is gone");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
