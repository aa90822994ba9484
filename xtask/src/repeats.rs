//! Loops in generated text: the toy default model often falls into repeating a span, and those
//! outputs give speculative decoding its highest τ (a drafter predicts a loop easily). The
//! default-pair benchmark reports how many outputs loop and the speedup over the rest, so the
//! headline number is not carried by repetition.

/// Tokens a back-to-back repeat must cover for an output to count as looping.
pub const LONG_REPEAT: usize = 32;
/// The longest repeating span looked for.
pub const MAX_PERIOD: usize = 32;

/// Whether `tokens` holds a span of at most [`MAX_PERIOD`] tokens repeated back to back over at
/// least [`LONG_REPEAT`] tokens (`t[i] == t[i + p]` for that many consecutive `i`).
pub fn loops(tokens: &[u32]) -> bool {
    (1..=MAX_PERIOD).any(|p| {
        let mut run = 0;
        for i in p..tokens.len() {
            run = if tokens[i] == tokens[i - p] { run + 1 } else { 0 };
            // The run covers its p-token span plus every token that repeated it.
            if run + p >= LONG_REPEAT && run >= p {
                return true;
            }
        }
        false
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_back_to_back_repeats_loop_and_short_or_varied_text_does_not() {
        let varied: Vec<u32> = (0..200).map(|i| (i * 7919 % 1000) as u32).collect();
        assert!(!loops(&varied));
        // One token repeated 40 times, after varied text.
        let mut one = varied[..50].to_vec();
        one.extend(std::iter::repeat_n(5, 40));
        assert!(loops(&one));
        // A 5-token line repeated 8 times (40 tokens).
        let mut line = varied[..50].to_vec();
        for _ in 0..8 {
            line.extend([1, 2, 3, 4, 9]);
        }
        assert!(loops(&line));
        // Twice a 10-token phrase is not a loop (20 < 32 tokens).
        let mut twice = varied[..50].to_vec();
        twice.extend((0..20).map(|i| 100 + (i % 10) as u32));
        twice.extend(varied[60..100].iter());
        assert!(!loops(&twice));
    }
}
