//! Prompts cut from corpus documents at line boundaries: the head of a file (how the
//! evaluation prompts of the embedded default are made, from test-split files) or a window of
//! whole lines ending anywhere inside it (more varied drafter training prompts, from
//! train-split files). Selection is a seeded shuffle, so a seed gives the same prompts on any
//! machine with the same corpus.

use crate::corpus::{list_sources, read_split, stdlib_dir, Split};
use crate::error::{Error, Result};
use crate::rng::SplitMix64;

/// Where in a document a prompt is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// The document's first lines.
    Head,
    /// Whole lines ending at a random line boundary inside the document.
    Inside,
}

/// One prompt and the document it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    /// Name of the source document.
    pub source: String,
    /// The prompt: whole lines cut from the document.
    pub text: String,
}

/// The longest run of whole lines of `text[..end]` that fits in `max_bytes` and ends at `end`
/// (a line boundary); `None` when not even the last line fits or fewer than `min_bytes` remain.
fn lines_before(text: &str, end: usize, min_bytes: usize, max_bytes: usize) -> Option<&str> {
    let from = end.saturating_sub(max_bytes);
    // Start just after a newline (or at the document's start), so the prompt begins a line.
    let start = if from == 0 {
        0
    } else {
        text[..end].char_indices().skip_while(|&(i, _)| i < from - 1).find(|&(_, c)| c == '\n')?.0 + 1
    };
    let s = &text[start..end];
    (s.trim().len() >= min_bytes).then_some(s)
}

/// The line boundaries of `text` (byte offsets just after each `\n`).
fn boundaries(text: &str) -> Vec<usize> {
    text.match_indices('\n').map(|(i, _)| i + 1).collect()
}

/// Up to `count` prompts from `docs` (`(name, text)` pairs), at most one per document, of
/// `min_bytes..=max_bytes` bytes of whole lines, chosen by a shuffle seeded with `seed`.
/// Documents too short for a prompt are passed over, so fewer than `count` may come back.
pub fn cut_prompts(
    docs: &[(String, String)],
    cut: Cut,
    count: usize,
    min_bytes: usize,
    max_bytes: usize,
    seed: u64,
) -> Vec<Prompt> {
    let mut rng = SplitMix64::new(seed);
    let mut order: Vec<usize> = (0..docs.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut out = Vec::with_capacity(count.min(docs.len()));
    for i in order {
        if out.len() == count {
            break;
        }
        let (name, text) = (&docs[i].0, &docs[i].1);
        let b = boundaries(text);
        let end = match cut {
            // The last line boundary within max_bytes of the start.
            Cut::Head => b.iter().copied().take_while(|&e| e <= max_bytes).last(),
            // A boundary past the first max_bytes, so the window is not the head again.
            Cut::Inside => {
                let inner: Vec<usize> = b.iter().copied().filter(|&e| e > max_bytes).collect();
                (!inner.is_empty()).then(|| inner[rng.below(inner.len() as u64) as usize])
            }
        };
        if let Some(s) = end.and_then(|e| lines_before(text, e, min_bytes, max_bytes)) {
            out.push(Prompt { source: name.clone(), text: s.to_string() });
        }
    }
    out
}

/// `count` prompts from the heads of this machine's Python standard library files of one
/// split (40 to 400 bytes of whole lines, seeded); an error names the split when it has too
/// few files for them.
pub fn stdlib_heads(split: Split, count: usize, seed: u64) -> Result<Vec<Prompt>> {
    from_split(split, count, "files give a prompt", |docs| cut_prompts(docs, Cut::Head, count, 40, 400, seed))
}

/// `count` prompts from one split of this machine's standard library: every file's head first,
/// then windows inside the files ([`heads_then_windows`]). For calibration, whose rounds are
/// only as independent as its prompts: the heads of a split alone run out at one per file.
pub fn stdlib_prompts(split: Split, count: usize, seed: u64) -> Result<Vec<Prompt>> {
    from_split(split, count, "distinct prompts can be cut from it", |docs| {
        heads_then_windows(docs, count, 40, 400, seed)
    })
}

/// What `cut` makes of the documents of one split; an error names the split when that is
/// fewer than `count` prompts (`short` says what ran out).
fn from_split(
    split: Split,
    count: usize,
    short: &str,
    cut: impl FnOnce(&[(String, String)]) -> Vec<Prompt>,
) -> Result<Vec<Prompt>> {
    let files = list_sources(&stdlib_dir(None)?)?;
    let p = cut(&read_split(&files, split));
    if p.len() < count {
        return Err(Error::Invalid {
            what: format!("{split:?} split of the standard library"),
            detail: format!("only {} {short} (wanted {count})", p.len()),
        });
    }
    Ok(p)
}

/// Up to `count` distinct prompts: the documents' heads, then windows inside them, several per
/// document if need be (one pass of [`cut_prompts`] cuts at most one window per document; the
/// passes stop when one finds nothing new).
pub fn heads_then_windows(
    docs: &[(String, String)],
    count: usize,
    min_bytes: usize,
    max_bytes: usize,
    seed: u64,
) -> Vec<Prompt> {
    let mut out = cut_prompts(docs, Cut::Head, count, min_bytes, max_bytes, seed);
    let mut seen: std::collections::BTreeSet<String> = out.iter().map(|p| p.text.clone()).collect();
    for pass in 1u64.. {
        if out.len() >= count {
            break;
        }
        let pass_seed = seed ^ pass.wrapping_mul(0x9e37_79b9);
        let fresh: Vec<Prompt> = cut_prompts(docs, Cut::Inside, count - out.len(), min_bytes, max_bytes, pass_seed)
            .into_iter()
            .filter(|p| seen.insert(p.text.clone()))
            .collect();
        if fresh.is_empty() {
            break;
        }
        out.extend(fresh);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(name: &str, lines: usize) -> (String, String) {
        (name.into(), (0..lines).map(|i| format!("line {i} of {name}\n")).collect())
    }

    #[test]
    fn heads_are_whole_first_lines_within_the_budget() {
        let docs = vec![doc("a.py", 50), doc("b.py", 3), ("c.py".into(), "no newline at all".into())];
        let p = cut_prompts(&docs, Cut::Head, 10, 10, 64, 1);
        // c.py has no line boundary; b.py's 3 lines fit whole.
        assert_eq!(p.len(), 2, "{p:?}");
        for pr in &p {
            let text = &docs.iter().find(|d| d.0 == pr.source).unwrap().1;
            assert!(text.starts_with(&pr.text) && pr.text.ends_with('\n') && pr.text.len() <= 64, "{pr:?}");
        }
        let a = p.iter().find(|x| x.source == "a.py").unwrap();
        // Adding the next line would exceed 64 bytes.
        assert!(a.text.len() + "line 9 of a.py\n".len() > 64, "{a:?}");
    }

    #[test]
    fn inside_cuts_are_whole_lines_past_the_head() {
        let docs: Vec<_> = (0..20).map(|i| doc(&format!("m{i}.py"), 40)).collect();
        let p = cut_prompts(&docs, Cut::Inside, 8, 20, 80, 7);
        assert_eq!(p.len(), 8);
        for pr in &p {
            let text = &docs.iter().find(|d| d.0 == pr.source).unwrap().1;
            let at = text.find(&pr.text).expect("a substring");
            assert!(at > 0 && (at == 0 || text.as_bytes()[at - 1] == b'\n'), "starts a line: {pr:?}");
            assert!(pr.text.ends_with('\n') && pr.text.len() <= 80 && pr.text.len() >= 20, "{pr:?}");
        }
        let sources: std::collections::HashSet<_> = p.iter().map(|x| &x.source).collect();
        assert_eq!(sources.len(), 8, "one prompt per document");
    }

    #[test]
    fn the_seed_decides_the_selection() {
        let docs: Vec<_> = (0..30).map(|i| doc(&format!("m{i}.py"), 40)).collect();
        let a = cut_prompts(&docs, Cut::Inside, 5, 10, 100, 3);
        assert_eq!(a, cut_prompts(&docs, Cut::Inside, 5, 10, 100, 3));
        assert_ne!(a, cut_prompts(&docs, Cut::Inside, 5, 10, 100, 4));
    }

    #[test]
    fn heads_come_first_then_distinct_windows_several_per_document() {
        let docs: Vec<_> = (0..3).map(|i| doc(&format!("m{i}.py"), 60)).collect();
        let p = heads_then_windows(&docs, 12, 20, 80, 5);
        assert_eq!(p.len(), 12, "three heads cannot give 12 prompts: windows make up the rest");
        for pr in &p[..3] {
            assert!(docs.iter().any(|d| d.1.starts_with(&pr.text)), "the first three are heads: {pr:?}");
        }
        let texts: std::collections::HashSet<_> = p.iter().map(|x| &x.text).collect();
        assert_eq!(texts.len(), 12, "no prompt twice");
        // A corpus that cannot give that many stops, with what it has.
        let short = vec![doc("s.py", 4)];
        let few = heads_then_windows(&short, 50, 5, 40, 1);
        assert!(!few.is_empty() && few.len() < 50, "{}", few.len());
    }

    #[test]
    fn non_ascii_text_is_cut_on_character_boundaries() {
        let text: String = (0..30).map(|i| format!("é{i} ünïcödé ✓\n")).collect();
        let docs = vec![("u.py".to_string(), text)];
        for seed in 0..20 {
            for cut in [Cut::Head, Cut::Inside] {
                for p in cut_prompts(&docs, cut, 1, 5, 37, seed) {
                    assert!(p.text.starts_with('é') && p.text.ends_with('\n'), "{p:?}");
                }
            }
        }
    }
}
