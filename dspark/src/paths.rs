//! Checks on the directories the subcommands are given, run before anything is read or written.
//! Which target and drafter to run is the engine crate's choice, shared with `dspark-serve`.

use std::path::{Component, Path, PathBuf};

pub use engine::selection::{drafter_choice, drafter_dir, refuse_drafter_as_model, select_target};

/// Why an output directory was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutDirError {
    #[error("--out {} is the source checkpoint {} — writing there would replace it; pick another --out", out.display(), src.display())]
    IsSource { src: PathBuf, out: PathBuf },
    #[error(
        "--out {} contains the source checkpoint {} — writing there would delete the source and everything else in \
         that directory; pick a directory outside the source (for example a sibling of it)",
        out.display(),
        src.display()
    )]
    ContainsSource { src: PathBuf, out: PathBuf },
    #[error("--out {} is inside the source checkpoint {} — pick a directory outside the source", out.display(), src.display())]
    InsideSource { src: PathBuf, out: PathBuf },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// Checks, before any work, that a file can later be written at `path`: it is not a directory,
/// and its directory exists and takes new files (probed with a file created and removed).
/// `flag` names the option in the error.
pub fn check_output_file(path: &Path, flag: &str) -> anyhow::Result<()> {
    if path.is_dir() {
        anyhow::bail!("{flag} {}: is a directory; expected a file path", path.display());
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !parent.is_dir() {
        anyhow::bail!("{flag} {}: {} is not a directory", path.display(), parent.display());
    }
    check_writable_dir(parent).map_err(|e| anyhow::anyhow!("{flag} {}: {e}", path.display()))
}

/// Checks, before any work, that a directory can later be created (or filled) at `dir`: its
/// nearest existing ancestor (or `dir` itself) is a directory that takes new files.
pub fn check_creatable_dir(dir: &Path, flag: &str) -> anyhow::Result<()> {
    let abs = std::path::absolute(dir).map_err(|e| anyhow::anyhow!("{flag} {}: {e}", dir.display()))?;
    let existing = abs.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    if !existing.is_dir() {
        anyhow::bail!("{flag} {}: {} is not a directory", dir.display(), existing.display());
    }
    check_writable_dir(existing).map_err(|e| anyhow::anyhow!("{flag} {}: {e}", dir.display()))
}

/// Whether new files can be created in the existing directory `dir` (permissions, read-only
/// mounts): a probe file is created and removed. The error says which directory refused.
pub fn check_writable_dir(dir: &Path) -> anyhow::Result<()> {
    let probe = dir.join(format!(".dspark-write-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => anyhow::bail!("cannot create files in {} ({e})", dir.display()),
    }
}

/// `p` made absolute with symlinks resolved: the nearest existing ancestor is canonicalized and
/// the rest (which does not exist yet, so has no links) appended with `.` and `..` applied.
pub fn resolve(p: &Path) -> Result<PathBuf, OutDirError> {
    let abs = std::path::absolute(p).map_err(|source| OutDirError::Io { path: p.to_path_buf(), source })?;
    let mut base = abs.as_path();
    let mut tail = Vec::new();
    let mut out = loop {
        match base.canonicalize() {
            Ok(c) => break c,
            Err(source) => match (base.parent(), base.components().next_back()) {
                (Some(parent), Some(last)) => {
                    tail.push(last);
                    base = parent;
                }
                // A root that does not resolve: nothing left to walk up.
                _ => return Err(OutDirError::Io { path: p.to_path_buf(), source }),
            },
        }
    };
    for c in tail.into_iter().rev() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => out.push(name),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    Ok(out)
}

/// Refuses an output directory that is the source checkpoint, contains it (a parent or any
/// ancestor: replacing it would delete the source and its siblings), or lies inside it. Paths
/// are compared resolved, so `.`, `..` and symlinks do not hide a match; `out` need not exist.
pub fn check_out_dir(src: &Path, out: &Path) -> Result<(), OutDirError> {
    let (s, o) = (resolve(src)?, resolve(out)?);
    let (src, out) = (src.to_path_buf(), out.to_path_buf());
    if s == o {
        Err(OutDirError::IsSource { src, out })
    } else if s.starts_with(&o) {
        Err(OutDirError::ContainsSource { src, out })
    } else if o.starts_with(&s) {
        Err(OutDirError::InsideSource { src, out })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let d = std::env::temp_dir().join(format!("dspark-paths-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(d.join("model")).unwrap();
            std::fs::create_dir_all(d.join("sibling")).unwrap();
            Scratch(d.canonicalize().unwrap())
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn resolves_missing_tails_against_the_nearest_existing_ancestor() {
        let s = Scratch::new("resolve");
        assert_eq!(resolve(&s.0.join("model/./x/../../sibling")).unwrap(), s.0.join("sibling"));
        assert_eq!(resolve(&s.0.join("new/a/../b")).unwrap(), s.0.join("new/b"));
        assert_eq!(resolve(&s.0.join("new/../model")).unwrap(), s.0.join("model"));
        assert_eq!(resolve(&s.0.join("new/..")).unwrap(), s.0);
    }

    #[test]
    fn refuses_the_source_its_ancestors_and_its_insides() {
        let s = Scratch::new("check");
        let model = s.0.join("model");
        let same = check_out_dir(&model, &s.0.join("sibling/../model/.")).unwrap_err();
        assert!(matches!(same, OutDirError::IsSource { .. }), "{same}");
        let parent = check_out_dir(&model, &s.0).unwrap_err();
        assert!(matches!(parent, OutDirError::ContainsSource { .. }), "{parent}");
        assert!(parent.to_string().contains("delete the source"), "{parent}");
        let inside = check_out_dir(&model, &model.join("q4/deeper")).unwrap_err();
        assert!(matches!(inside, OutDirError::InsideSource { .. }), "{inside}");
        check_out_dir(&model, &s.0.join("model-q4")).unwrap();
        check_out_dir(&model, &s.0.join("sibling")).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn sees_through_symlinks() {
        let s = Scratch::new("link");
        std::os::unix::fs::symlink(s.0.join("model"), s.0.join("alias")).unwrap();
        let e = check_out_dir(&s.0.join("model"), &s.0.join("alias")).unwrap_err();
        assert!(matches!(e, OutDirError::IsSource { .. }), "{e}");
    }

    #[test]
    fn output_files_need_a_writable_directory_and_must_not_be_one() {
        let s = Scratch::new("outfile");
        check_output_file(&s.0.join("sibling/rounds.jsonl"), "--rounds-out").unwrap();
        let e = check_output_file(&s.0.join("sibling"), "--rounds-out").unwrap_err().to_string();
        assert!(e.contains("--rounds-out") && e.contains("is a directory"), "{e}");
        std::fs::write(s.0.join("file"), "x").unwrap();
        let e = check_output_file(&s.0.join("file/rounds.jsonl"), "--plot").unwrap_err().to_string();
        assert!(e.contains("--plot") && e.contains("is not a directory"), "{e}");
        assert!(std::fs::read_dir(s.0.join("sibling")).unwrap().next().is_none(), "the probe must be removed");
        check_creatable_dir(&s.0.join("sibling/new/deeper"), "--out").unwrap();
        let e = check_creatable_dir(&s.0.join("file/new"), "--out").unwrap_err().to_string();
        assert!(e.contains("--out") && e.contains("is not a directory"), "{e}");
    }
}
