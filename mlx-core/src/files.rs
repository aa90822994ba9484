//! Bounded reads of the small text files around a checkpoint (configs, tokenizers, calibration,
//! ledgers). A path that is a device, a pipe or a directory, or a file far larger than its kind
//! can be, is refused before it is read: a `config.json` linked to `/dev/zero` would otherwise
//! be read until memory runs out.

use std::io::{Error, ErrorKind, Read};
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
    let too_big = |n: u64| {
        Error::new(
            ErrorKind::InvalidData,
            format!("{n} bytes or more; a file of this kind holds at most {}", human(limit)),
        )
    };
    if meta.len() > limit {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // A file that grows after the check still stops at the limit.
    std::fs::File::open(path)?.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| Error::new(ErrorKind::InvalidData, format!("not UTF-8 text ({e})")))
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
}
