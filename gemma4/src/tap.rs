//! Hidden-state taps: which hidden states a forward also returns, for drafters that read the
//! target's multi-layer context. An empty tap adds no ops, so numerics are unchanged.

/// A point in the forward whose hidden state can be captured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TapPoint {
    /// The residual stream after layer `i` (after `layer_scalar`).
    Layer(usize),
    /// The post-final-norm hidden (what the LM head reads).
    FinalNorm,
}

/// An ordered set of tap points; captured states are concatenated on the feature axis in this
/// order, giving `[B, L, H · len]`.
///
/// A window limits which prompt rows a prefill must tap: a drafter that attends over only the
/// last `window` context rows needs no hidden states of earlier rows, and a prefill chunk
/// whose rows all lie before them runs untapped (on a KV-shared target that skips the layers
/// past the last one that writes the cache).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TapSet {
    points: Vec<TapPoint>,
    window: Option<usize>,
}

impl TapSet {
    /// Taps at the given points, in order (duplicates are kept: the caller chose them).
    pub fn new(points: impl IntoIterator<Item = TapPoint>) -> TapSet {
        TapSet { points: points.into_iter().collect(), window: None }
    }

    /// The same points, tapping only the last `window` prompt rows (`None`: all rows).
    pub fn with_window(mut self, window: Option<usize>) -> TapSet {
        self.window = window;
        self
    }

    /// How many of the last prompt rows a prefill must tap (`None`: all).
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// The first of `rows` committed rows whose hidden states are needed.
    pub fn first_needed_row(&self, rows: usize) -> usize {
        self.window.map_or(0, |w| rows.saturating_sub(w))
    }

    /// Taps after each listed layer.
    pub fn layers(layers: &[usize]) -> TapSet {
        TapSet::new(layers.iter().map(|&i| TapPoint::Layer(i)))
    }

    /// The points.
    pub fn points(&self) -> &[TapPoint] {
        &self.points
    }

    /// True if nothing is tapped.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Positions in the output of tap `p`.
    pub(crate) fn slots(&self, p: TapPoint) -> impl Iterator<Item = usize> + '_ {
        self.points.iter().enumerate().filter(move |(_, q)| **q == p).map(|(i, _)| i)
    }
}
