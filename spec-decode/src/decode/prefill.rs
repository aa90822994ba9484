//! Tail-split prefill: every prompt token but the last runs through the target (tapped, in
//! chunks), seeding the drafter's context; the last prompt token is *pending* and heads the first
//! verify window. A prefill can resume from the state after a prefix of its prompt
//! ([`PrefixState`], on the same chunk grid), which a prompt cache keeps.

use std::time::Instant;

use gemma4::{Cache, Model, TapSet};
use mlx_core::{concatenate, Array};

use crate::error::{Error, Result};

/// The state after the tail-split prefill: the target cache holds every prompt token but the
/// last, whose tapped rows seed the drafter; the last prompt token is pending. Reusable: every
/// decode from it starts from a copy of the cache (arrays are shared, so copies are free).
#[derive(Clone, Debug)]
pub struct Prefilled {
    pub(super) cache: Cache,
    /// Tapped rows of the committed prompt tokens, the last `taps.window()` of them when the
    /// taps have a window // `[1, min(L−1, window), m·H]`
    pub(crate) ctx: Option<Array>,
    pub(super) taps: TapSet,
    pub(super) pending: u32,
    pub(super) committed: usize,
    pub(super) prompt_tokens: usize,
    pub(super) forwards: usize,
    pub(super) ms: f64,
}

impl Prefilled {
    /// Tokens in the target cache.
    pub fn committed(&self) -> usize {
        self.committed
    }

    /// The target cache after the prompt's head (every token but the last).
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The last prompt token, not yet run through the target.
    pub fn pending(&self) -> u32 {
        self.pending
    }

    /// Tokens in the prompt.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// Hands over the tapped rows of the committed prompt tokens (to seed a drafter once): all
    /// of them, or the last `window` when the taps have one.
    pub fn take_ctx(&mut self) -> Option<Array> {
        self.ctx.take()
    }

    /// Milliseconds the prefill took.
    pub fn ms(&self) -> f64 {
        self.ms
    }

    /// The same prefill with `ms` as its wall time: a prefill run chunk by chunk over several
    /// calls (resumed from its states) sums the time of every call.
    pub fn with_ms(mut self, ms: f64) -> Prefilled {
        self.ms = ms;
        self
    }
}

/// The target cache and the tapped rows after the first tokens of a prompt, prefilled in chunks
/// on the grid of `step` (chunk boundaries at multiples of `step`). A later prompt that starts
/// with the same tokens can resume from it ([`prefill_from`]); the result is then bit-identical
/// to prefilling that prompt from scratch, because the resumed computation is the very same
/// sequence of chunk forwards (see [`prefill_from`] for the rule that guarantees it).
#[derive(Clone, Debug)]
pub struct PrefixState {
    tokens: Vec<u32>,
    cache: Cache,
    /// Tapped rows per tapped chunk // each `[1, chunk, m·H]`
    rows: Vec<Array>,
    /// The committed row `rows` start at (the state's length when no chunk was tapped).
    rows_start: usize,
    taps: TapSet,
    step: usize,
    forwards: usize,
}

impl PrefixState {
    /// The prompt tokens this state has run through the target.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Whether [`prefill_from`] may resume from this state for `prompt` (tapped with `taps`, in
    /// chunks of `step`): the state's tokens start `prompt`'s head (all tokens but the last),
    /// and it ends on a chunk boundary of the same grid or covers the whole head; and it holds
    /// the tapped rows `prompt` needs from before its end (with a tap window, a state made for
    /// a longer prompt may have left them untapped).
    pub fn resumable_for(&self, taps: &TapSet, prompt: &[u32], step: usize) -> bool {
        let head = prompt.len().saturating_sub(1);
        let n = self.tokens.len();
        let needed = taps.first_needed_row(head);
        self.taps == *taps
            && self.step == step.max(1)
            && n <= head
            && prompt[..n] == self.tokens[..]
            && (n.is_multiple_of(self.step) || n == head)
            && (taps.is_empty() || needed >= n || self.rows_start <= needed)
    }
}

/// Runs all but the last prompt token through the target (tapped with `taps`, in chunks of
/// `step`), evaluating the cache after each chunk.
pub fn prefill(target: &Model, taps: &TapSet, prompt: &[u32], step: usize) -> Result<Prefilled> {
    prefill_from(target, taps, prompt, step, None, |_| {})
}

/// [`prefill`] resuming from `from` (the state after a prefix of the prompt), calling
/// `snapshot` with the state after every chunk (a prompt cache keeps them).
///
/// Exactness rule: `from` must end on a chunk boundary of the same grid (its length a multiple
/// of `step`) or cover the prompt's whole head. A from-scratch prefill passes through exactly
/// that state and then runs exactly the chunks that remain, so the result has the same bits.
/// Resuming anywhere else would split a chunk in two, and a chunked forward is not guaranteed
/// to give the bits of the whole one (the sliding-window ring is written in another order and
/// the attention sums over the keys in other groupings); such a `from` is refused.
pub fn prefill_from(
    target: &Model,
    taps: &TapSet,
    prompt: &[u32],
    step: usize,
    from: Option<&PrefixState>,
    mut snapshot: impl FnMut(PrefixState),
) -> Result<Prefilled> {
    let vocab = target.config().vocab_size;
    let step = step.max(1);
    let Some((&last, head)) = prompt.split_last() else {
        return Err(Error::Settings { field: "prompt", detail: "the prompt is empty".into() });
    };
    if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::Settings {
            field: "prompt",
            detail: format!("token id {bad} is outside the vocabulary of {vocab}"),
        });
    }
    let t0 = Instant::now();
    // With a tap window, chunks that end before the first needed row run untapped, and the
    // chunk holding it taps (and runs the KV-shared layers for) the rows from it on.
    let needed = taps.first_needed_row(head.len());
    let (mut cache, mut rows, mut rows_start, mut forwards, start) = match from {
        None => (target.new_cache(), Vec::new(), None, 0, 0),
        Some(f) if f.resumable_for(taps, prompt, step) => {
            let start = (!f.rows.is_empty()).then_some(f.rows_start);
            (f.cache.clone(), f.rows.clone(), start, f.forwards, f.tokens.len())
        }
        Some(_) => {
            return Err(Error::Contract(
                "a prefix state can only be resumed on a chunk boundary of the same grid and taps".into(),
            ))
        }
    };
    let mut done = start;
    for chunk in head[start..].chunks(step) {
        let ids = gemma4::generate::ids_array(chunk)?;
        if taps.is_empty() || done + chunk.len() <= needed {
            target.forward(&ids, Some(&mut cache))?;
        } else if let Some(t) =
            target.forward_tapped_from(&ids, Some(&mut cache), taps, needed.saturating_sub(done))?.taps
        {
            // The chunk's rows from the first needed one on // [1, ≤ chunk, m·H]
            mlx_core::eval(&[&t])?;
            rows.push(t);
            rows_start.get_or_insert(done.max(needed));
        }
        cache.eval()?;
        forwards += 1;
        done += chunk.len();
        snapshot(PrefixState {
            tokens: head[..done].to_vec(),
            cache: cache.clone(),
            rows: rows.clone(),
            rows_start: rows_start.unwrap_or(done),
            taps: taps.clone(),
            step,
            forwards,
        });
    }
    let ctx = if rows.is_empty() {
        // A one-token prompt commits nothing: an empty context of the right width.
        (!taps.is_empty())
            .then(|| {
                let width = (taps.points().len() * target.config().hidden_size) as i32;
                Array::zeros(&[1, 0, width], target.dtype())
            })
            .transpose()?
    } else {
        // The rows from the first needed one: all, or the window's.
        let all = concatenate(&rows, 1)?; // [1, head − rows_start, m·H]
        let skip = needed.saturating_sub(rows_start.unwrap_or(0)) as i32;
        Some(if skip > 0 { all.slice_axis(1, skip, all.dim(1)?)? } else { all })
    };
    Ok(Prefilled {
        cache,
        ctx,
        taps: taps.clone(),
        pending: last,
        committed: head.len(),
        prompt_tokens: prompt.len(),
        forwards,
        ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}
