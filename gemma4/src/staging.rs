//! Atomic directory writes: files go to a hidden staging directory next to the destination,
//! which is renamed into place at the end, so an interrupted run never leaves something that
//! looks like finished output.
//!
//! Names next to `dest` (for `dest = out/model`, process 42):
//! - `out/.model.tmp-42`: the directory being written;
//! - `out/.model.tmp-42.old`: a replaced `dest`, parked there between the two renames of a
//!   `force` commit and deleted once the new one is in place.
//!
//! A run killed at any point leaves at most these two behind. The next [`StagedDir::new`] for
//! the same `dest` resolves them (see [`recover`]): a parked old copy is put back if `dest` is
//! missing (the killed run never finished, so the state reverts to before it), and everything
//! else of processes that are gone is deleted.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

fn io(path: &Path, source: std::io::Error) -> Error {
    Error::Io { path: path.to_path_buf(), source }
}

/// A directory being written: files go to `.<name>.tmp-PID` and `commit` renames it into place.
pub struct StagedDir {
    tmp: PathBuf,
    dest: PathBuf,
    committed: bool,
}

impl StagedDir {
    /// Starts writing `dest`, after resolving what killed runs left next to it ([`recover`]).
    /// With `force`, an existing `dest` is replaced at commit; without it, an existing
    /// non-empty `dest` is refused.
    pub fn new(dest: &Path, force: bool) -> Result<StagedDir> {
        recover(dest)?;
        if dest.exists() && !force {
            let empty = std::fs::read_dir(dest).map_err(|e| io(dest, e))?.next().is_none();
            if !empty {
                return Err(Error::Input {
                    op: "write checkpoint",
                    detail: format!("{} exists and is not empty (replacing it must be forced)", dest.display()),
                });
            }
        }
        let tmp = staging_path(dest, std::process::id());
        for stale in [tmp.clone(), aside(&tmp)] {
            if stale.exists() {
                std::fs::remove_dir_all(&stale).map_err(|e| io(&stale, e))?;
            }
        }
        std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
        Ok(StagedDir { tmp, dest: dest.to_path_buf(), committed: false })
    }

    /// Where to write files now.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Moves the finished directory into place. A replaced `dest` is first renamed aside and
    /// only deleted once the new one is in place (restored if that rename fails), so at every
    /// moment one complete version exists, under `dest` or, after a kill between the renames,
    /// under the aside name that the next [`StagedDir::new`] restores.
    pub fn commit(mut self) -> Result<PathBuf> {
        if let Some(parent) = self.dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        }
        let old = self.dest.exists().then(|| aside(&self.tmp));
        if let Some(old) = &old {
            std::fs::rename(&self.dest, old).map_err(|e| io(&self.dest, e))?;
        }
        if let Err(e) = std::fs::rename(&self.tmp, &self.dest) {
            if let Some(old) = &old {
                let _ = std::fs::rename(old, &self.dest);
            }
            return Err(io(&self.dest, e));
        }
        self.committed = true;
        if let Some(old) = &old {
            // The new output is in place; a leftover copy of the old one is cleaned next time.
            let _ = remove_any(old);
        }
        Ok(self.dest.clone())
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

/// What [`recover`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// The parked old copy moved back to `dest` (which was missing).
    pub restored: Option<PathBuf>,
    /// Staging and parked directories of finished processes that were deleted.
    pub removed: Vec<PathBuf>,
}

/// Resolves what runs killed mid-write left next to `dest`, deterministically:
/// 1. if `dest` is missing and a parked old copy (`.<name>.tmp-PID.old`) of a process that is
///    gone exists, it is renamed back to `dest` (the one with the smallest name if several);
/// 2. then every staging or parked directory of a process that is gone is deleted (best effort).
///
/// Directories of live processes other than this one are left alone; this process's own are
/// treated as stale (a live `StagedDir` of ours for the same `dest` would be a caller bug).
pub fn recover(dest: &Path) -> Result<Recovery> {
    let mut rec = Recovery::default();
    let Some(name) = dest.file_name().and_then(|n| n.to_str()) else { return Ok(rec) };
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Ok(entries) = std::fs::read_dir(&parent) else { return Ok(rec) };
    let prefix = format!(".{name}.tmp-");
    let mut stale: Vec<(PathBuf, bool)> = Vec::new(); // (path, is parked old copy)
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(rest) = file.to_str().and_then(|f| f.strip_prefix(&prefix)) else { continue };
        let (pid, parked) = match rest.strip_suffix(".old") {
            Some(p) => (p, true),
            None => (rest, false),
        };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if pid == std::process::id() || !process_alive(pid) {
            stale.push((entry.path(), parked));
        }
    }
    stale.sort();
    if !dest.exists() {
        if let Some((old, _)) = stale.iter().find(|(_, parked)| *parked) {
            std::fs::rename(old, dest).map_err(|e| io(dest, e))?;
            rec.restored = Some(old.clone());
        }
    }
    for (path, _) in stale {
        // Best effort: a directory that cannot be deleted (another user's) is no reason to fail.
        if rec.restored.as_ref() != Some(&path) && remove_any(&path).is_ok() {
            rec.removed.push(path);
        }
    }
    Ok(rec)
}

/// Deletes a directory tree, or a file or link (a forced `dest` need not have been a
/// directory, and `remove_dir_all` refuses anything else, which left parked files behind).
fn remove_any(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    }
}

/// Whether process `pid` exists: `/proc` where there is one, else `kill -0`. When neither can
/// tell, the process counts as alive, so nothing of a possibly running writer is deleted.
fn process_alive(pid: u32) -> bool {
    if Path::new("/proc/self").exists() {
        return Path::new(&format!("/proc/{pid}")).exists();
    }
    match std::process::Command::new("kill").args(["-0", &pid.to_string()]).output() {
        Ok(out) => out.status.success(),
        Err(_) => true,
    }
}

/// The staging directory of process `pid` for `dest`.
pub fn staging_path(dest: &Path, pid: u32) -> PathBuf {
    let name = dest.file_name().and_then(|n| n.to_str()).unwrap_or("checkpoint");
    dest.with_file_name(format!(".{name}.tmp-{pid}"))
}

/// Where `commit` parks a replaced output until the new one is in place.
pub fn aside(tmp: &Path) -> PathBuf {
    let mut o = tmp.as_os_str().to_os_string();
    o.push(".old");
    PathBuf::from(o)
}
