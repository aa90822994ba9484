//! The workspace's file primitives:
//! - bounded reads of the small text files around a checkpoint (configs, tokenizers,
//!   calibration, ledgers): a path that is a device, a pipe or a directory, or a file far larger
//!   than its kind can be, is refused before it is read (a `config.json` linked to `/dev/zero`
//!   would otherwise be read until memory runs out);
//! - atomic replacement of a file: a temporary file in the same directory is written, flushed
//!   to disk and renamed over the destination, and the directory is flushed, so a reader (or a
//!   crash) sees the old file or the new one, never half of one. The temporary is named
//!   `.NAME.tmp-XXXXXX` and removed if anything fails.

use std::io::{Error, ErrorKind, Read, Write};
use std::path::Path;

/// The most a JSON settings file (`config.json`, `dspark.json`, an index, a profile) may hold.
pub const JSON_LIMIT: u64 = 16 << 20;

/// The most a large text file (`tokenizer.json`, a ledger, a dump of rounds) may hold.
pub const LARGE_TEXT_LIMIT: u64 = 1 << 30;

/// Reads the UTF-8 text of the regular file at `path` (links followed), refusing anything that
/// is not a regular file or holds more than `limit` bytes. Errors are `std::io::Error`s whose
/// message says what was expected; callers add the path.
pub fn read_text(path: &Path, limit: u64) -> std::io::Result<String> {
    // Checked before opening: opening a FIFO blocks until a writer appears.
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        let kind = if meta.is_dir() { "a directory" } else { "not a regular file (a device, pipe or socket)" };
        return Err(Error::new(ErrorKind::InvalidInput, format!("{kind}; expected a regular file")));
    }
    if meta.len() > limit {
        return Err(too_big(meta.len(), limit));
    }
    // A file that grows after the check still stops at the limit.
    read_text_from(std::fs::File::open(path)?, limit)
}

/// Reads UTF-8 text from `reader` (standard input, a pipe), stopping with an error past `limit`
/// bytes instead of reading on.
pub fn read_text_from(reader: impl Read, limit: u64) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    reader.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_big(bytes.len() as u64, limit));
    }
    String::from_utf8(bytes).map_err(|e| Error::new(ErrorKind::InvalidData, format!("not UTF-8 text ({e})")))
}

fn too_big(n: u64, limit: u64) -> Error {
    Error::new(ErrorKind::InvalidData, format!("{n} bytes or more; a file of this kind holds at most {}", human(limit)))
}

/// Replaces `path` with `bytes` atomically (see the module docs).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, "", |tmp| {
        let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(tmp)?;
        f.write_all(bytes)
    })
}

/// Replaces `path` atomically with what `fill` writes to the temporary path it is given (for
/// writers that take a path: MLX's safetensors writer, image encoders). `suffix` ends the
/// temporary's name (MLX appends `.safetensors` to a name without it).
pub fn write_atomic_with(
    path: &Path,
    suffix: &str,
    fill: impl FnOnce(&Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "the path has no file name"))?;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new().prefix(&format!(".{name}.tmp-")).suffix(suffix).tempfile_in(dir)?;
    fill(tmp.path())?;
    // The filler may have written through another handle: flush the file by its name.
    std::fs::File::open(tmp.path())?.sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    sync_dir(dir)
}

/// Flushes a directory's entries (the rename) to disk; a no-op where directories cannot be
/// opened as files.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    std::fs::File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

fn human(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_devices_directories_and_oversized_files() {
        let dir = std::env::temp_dir().join(format!("mlx-core-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("ok.json");
        std::fs::write(&ok, "{}").unwrap();
        assert_eq!(read_text(&ok, 16).unwrap(), "{}");

        let big = dir.join("big.json");
        std::fs::write(&big, vec![b' '; 100]).unwrap();
        let e = read_text(&big, 64).unwrap_err();
        assert!(e.to_string().contains("at most"), "{e}");

        let e = read_text(&dir, 64).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");

        let bad = dir.join("bad.json");
        std::fs::write(&bad, [0xffu8, 0xfe]).unwrap();
        assert!(read_text(&bad, 64).unwrap_err().to_string().contains("UTF-8"));

        #[cfg(unix)]
        {
            // An endless device behind a link: refused at once, nothing read.
            let link = dir.join("config.json");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
            let e = read_text(&link, JSON_LIMIT).unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn atomic_writes_replace_whole_files_and_leave_no_temporaries() {
        let dir = std::env::temp_dir().join(format!("mlx-core-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ledger");
        write_atomic(&path, b"first").unwrap();
        write_atomic(&path, b"second, longer").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second, longer");
        // A failing filler leaves the old file and no temporary behind.
        let e = write_atomic_with(&path, ".x", |tmp| {
            std::fs::write(tmp, "half")?;
            Err(Error::other("the encoder failed"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("encoder failed"));
        assert_eq!(std::fs::read(&path).unwrap(), b"second, longer");
        let names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names, vec!["ledger".to_string()], "temporaries left behind");
        assert!(write_atomic(&dir.join("missing/ledger"), b"x").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
