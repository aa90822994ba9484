//! Response ids (`cmpl-…`, `chatcmpl-…`): 128 random bits from the operating system, so ids do
//! not repeat across restarts the way a counter's would.

use std::fmt::Write;

/// Random bytes in an id: 16, written as 32 hex digits.
const RANDOM_BYTES: usize = 16;

/// A fresh id, `prefix-` then 32 random hex digits.
pub fn fresh(prefix: &str) -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; RANDOM_BYTES];
    getrandom::fill(&mut bytes)?;
    let mut id = String::with_capacity(prefix.len() + 1 + 2 * RANDOM_BYTES);
    id.push_str(prefix);
    id.push('-');
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(id, "{b:02x}");
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_prefixed_random_hex() {
        let a = super::fresh("cmpl").unwrap();
        let b = super::fresh("cmpl").unwrap();
        assert_ne!(a, b);
        let hex = a.strip_prefix("cmpl-").unwrap();
        assert_eq!(hex.len(), 32);
        assert!(hex.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
    }
}
