//! Learning-rate schedule: linear warmup to the peak, then cosine decay to a floor.

/// `lr(s)` for 0-based step s: `peak·(s+1)/warmup` during warmup, then
/// `floor + ½(peak − floor)(1 + cos(π·p))` with p = (s − warmup)/(total − warmup) clamped to
/// [0, 1]; the floor is 10% of the peak by default.
#[derive(Clone, Debug, PartialEq)]
pub struct WarmupCosine {
    /// Learning rate at the end of warmup.
    pub peak: f64,
    /// Warmup steps.
    pub warmup: u64,
    /// Step at which the decay reaches `floor`.
    pub total: u64,
    /// Learning rate after the decay.
    pub floor: f64,
}

impl WarmupCosine {
    /// Warmup then cosine decay to 10% of `peak` at step `total`.
    pub fn new(peak: f64, warmup: u64, total: u64) -> WarmupCosine {
        WarmupCosine { peak, warmup, total, floor: 0.1 * peak }
    }

    /// The learning rate of 0-based step `s`.
    pub fn lr(&self, s: u64) -> f64 {
        if s < self.warmup {
            return self.peak * (s + 1) as f64 / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        let p = ((s - self.warmup) as f64 / span).clamp(0.0, 1.0);
        self.floor + 0.5 * (self.peak - self.floor) * (1.0 + (std::f64::consts::PI * p).cos())
    }
}
