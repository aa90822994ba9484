//! A small deterministic host RNG (SplitMix64) for choosing sequences and anchors. Its whole
//! state is one `u64`, so a checkpoint restores it exactly; evaluation uses its own instance,
//! so evaluating never shifts what training draws.

/// SplitMix64 (Steele, Lea & Flood 2014).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64 {
    /// The whole generator state; saved and restored with a checkpoint.
    pub state: u64,
}

impl SplitMix64 {
    /// A generator whose state starts at `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by rejection so no value is favoured.
    pub fn below(&mut self, n: u64) -> u64 {
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }
}
