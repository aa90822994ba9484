//! Training data from the target itself: each prompt is answered by the frozen target
//! ([`gemma4::generate::generate`]), then one tapped forward over prompt + response gives the
//! hidden rows a drafter learns from; sequences are written as shards ([`crate::shards`]).
//! With [`RegenMode::FromText`] the target is instead teacher-forced on given documents.
//!
//! The output directory is resumable through `regen.ledger`: its first line is a header (target,
//! taps and generation settings, which a rerun must repeat), each further line names one
//! committed shard and the input items it holds (with a hash of each item's text, so a changed
//! input file is noticed). A line is added only after its shard is committed, and the ledger is
//! rewritten atomically (temporary file + rename), so a crash leaves at worst a shard the ledger
//! does not name; a rerun removes such a shard and regenerates its items.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gemma4::chat_template::{ChatTemplate, ChatTemplateError};
use gemma4::generate::{generate, ids_array, GenerateConfig};
use gemma4::sampling::SamplerConfig;
use gemma4::tokenizer::{stop_tokens, Tokenizer};
use gemma4::{Model, TapPoint, TapSet};
use mlx_core::Dtype;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::shards::{list_shards, write_shard, Sequence, TargetId};

/// The ledger's file name inside the output directory.
pub const LEDGER: &str = "regen.ledger";
const LEDGER_FORMAT: &str = "dspark-regen-ledger";
const LEDGER_VERSION: u32 = 1;

/// Where the responses come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RegenMode {
    /// The target answers each prompt: up to `max_new` tokens, greedy when `temperature` is 0,
    /// otherwise sampled with seed `seed + item index` (so a resumed run draws what an
    /// uninterrupted one would have).
    Generate {
        /// Most tokens per answer.
        max_new: usize,
        /// Sampling temperature; 0 is greedy.
        temperature: f64,
        /// Base seed; item i samples with `seed + i`.
        seed: u64,
    },
    /// Each input is a document, teacher-forced in pieces of at most `max_len` tokens whose
    /// "response" starts at position 1 (every position but the first can anchor).
    FromText {
        /// Longest piece, in tokens.
        max_len: usize,
    },
}

impl std::fmt::Display for RegenMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegenMode::Generate { max_new, temperature, seed } if *temperature == 0.0 => {
                write!(f, "greedy answers of up to {max_new} tokens, seed {seed}")
            }
            RegenMode::Generate { max_new, temperature, seed } => {
                write!(f, "answers of up to {max_new} tokens sampled at temperature {temperature}, seed {seed}")
            }
            RegenMode::FromText { max_len } => write!(f, "documents in pieces of up to {max_len} tokens"),
        }
    }
}

/// Settings of a [`regen`] run.
#[derive(Clone, Debug)]
pub struct RegenOptions {
    /// How each input item becomes a sequence.
    pub mode: RegenMode,
    /// Tap indices in feature order (`num_hidden_layers` = the final-norm output, which must be
    /// last). See [`default_taps`] and [`validate_taps`].
    pub taps: Vec<usize>,
    /// A shard is committed once this many sequences are pending (and at the end). In
    /// [`RegenMode::FromText`] a shard holds whole documents, so it may hold a few more.
    pub seqs_per_shard: usize,
    /// Start over: remove the ledger and every shard in the output directory first.
    pub force: bool,
    /// How errors name input item `i` (e.g. `prompts.jsonl:7`, from [`read_input_lines`]);
    /// where absent, `input item i`.
    pub labels: Vec<String>,
    /// Encode prompts as plain text even when the tokenizer has a chat template (a base model
    /// continuing code, say).
    pub plain_prompts: bool,
}

impl RegenOptions {
    fn label(&self, i: usize) -> String {
        self.labels.get(i).cloned().unwrap_or_else(|| format!("input item {i}"))
    }
}

/// Reported after every item and at the start (where `done` counts the items skipped).
#[derive(Clone, Debug, Default)]
pub struct RegenProgress {
    /// Items handled (written, pending or skipped) of `total`.
    pub done: usize,
    /// Input items in all.
    pub total: usize,
    /// Items skipped because a committed shard already holds them.
    pub skipped: usize,
    /// Sequences produced by this run.
    pub sequences: usize,
    /// Tokens produced by this run.
    pub tokens: usize,
    /// Shards committed by this run.
    pub shards: usize,
    /// Wall time since the run started.
    pub elapsed: Duration,
}

/// What a [`regen`] run did.
#[derive(Clone, Debug, Default)]
pub struct RegenSummary {
    /// Sequences written by this run.
    pub sequences: usize,
    /// Tokens written by this run.
    pub tokens: usize,
    /// Shards committed by this run.
    pub shards: usize,
    /// Items skipped because an earlier run committed them.
    pub skipped: usize,
    /// Shards of an interrupted run that the ledger did not name, removed (their items were
    /// regenerated).
    pub orphans_removed: usize,
    /// Wall time of the run.
    pub elapsed: Duration,
}

/// `--taps`' default: a spread over the depth, `[L/4, L/2, 3L/4, L]` deduplicated, ending with
/// the final-norm output `L`.
pub fn default_taps(num_layers: usize) -> Vec<usize> {
    let mut v = vec![num_layers / 4, num_layers / 2, 3 * num_layers / 4, num_layers];
    v.dedup();
    v
}

/// Checks a tap list against a target of `num_layers` layers: non-empty, each index in
/// `0..=num_layers`, none twice, increasing, and the last the final-norm output (training recomputes the
/// target's distribution from it).
pub fn validate_taps(taps: &[usize], num_layers: usize) -> Result<()> {
    let bad = |detail: String| Err(Error::Invalid { what: format!("taps {taps:?}"), detail });
    if taps.is_empty() {
        return bad("at least one tap is needed (the final-norm output)".into());
    }
    if let Some(t) = taps.iter().find(|&&t| t > num_layers) {
        return bad(format!("tap {t} is outside 0..={num_layers} (the target has {num_layers} layers)"));
    }
    for (i, t) in taps.iter().enumerate() {
        if taps[..i].contains(t) {
            return bad(format!("tap {t} is listed twice"));
        }
    }
    if taps.last() != Some(&num_layers) {
        return bad(format!(
            "the last tap must be {num_layers}, the final-norm output, from which training recomputes the target's \
             distribution"
        ));
    }
    // The target returns taps in layer order; a drafter reads them in the order listed.
    if let Some(w) = taps.windows(2).find(|w| w[0] > w[1]) {
        return bad(format!("expected increasing layer indices ({} is listed before {})", w[0], w[1]));
    }
    Ok(())
}

/// The tap points of `taps` (`num_layers` = the final norm, `i` = the residual after layer
/// `i`), as `spec_decode::dspark::DSparkConfig::tap_set` maps them.
pub fn tap_set(taps: &[usize], num_layers: usize) -> TapSet {
    TapSet::new(taps.iter().map(|&i| if i == num_layers { TapPoint::FinalNorm } else { TapPoint::Layer(i) }))
}

/// Reads an input file: one item a line, either plain text or a JSON object with a string
/// field `key` (`"prompt"`, `"text"`) when the line starts with `{`. Blank lines are skipped.
pub fn read_inputs(path: &Path, key: &str) -> Result<Vec<String>> {
    Ok(read_input_lines(path, key)?.into_iter().map(|(_, s)| s).collect())
}

/// Like [`read_inputs`], each item with its label `file:line` (for [`RegenOptions::labels`]).
pub fn read_input_lines(path: &Path, key: &str) -> Result<Vec<(String, String)>> {
    let text = mlx_core::files::read_text(path, mlx_core::files::LARGE_TEXT_LIMIT)
        .map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
    let mut items = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), n + 1);
        if !line.starts_with('{') {
            items.push((at(), line.to_string()));
            continue;
        }
        let v: Value = serde_json::from_str(line).map_err(|e| Error::Invalid {
            what: at(),
            detail: format!("a line starting with '{{' must be JSON: {e}"),
        })?;
        match v.get(key) {
            Some(Value::String(s)) => items.push((at(), s.clone())),
            other => {
                return Err(Error::Invalid {
                    what: at(),
                    detail: format!(
                        "expected a JSON object with a string {key:?}, found {}",
                        other.map_or("no such field".to_string(), |o| o.to_string())
                    ),
                })
            }
        }
    }
    Ok(items)
}

/// A template failure as this crate's error, naming where the template came from.
fn template_error(e: ChatTemplateError) -> Error {
    Error::Invalid { what: e.origin, detail: e.detail }
}

/// Turns input text into token ids: with a tokenizer, through its chat template (then encoded
/// without added special tokens, as the template writes them) or, without a template, encoded
/// with them; without a tokenizer the text must be token ids separated by commas or spaces.
pub struct Encoder<'t> {
    tok: Option<&'t Tokenizer>,
    template: Option<ChatTemplate>,
    vocab_size: usize,
}

impl<'t> Encoder<'t> {
    /// An encoder for a target with `vocab_size` tokens; `chat` applies the chat template (if
    /// the tokenizer has one).
    pub fn new(tok: Option<&'t Tokenizer>, vocab_size: usize, chat: bool) -> Result<Encoder<'t>> {
        let template = match tok {
            Some(t) if chat => ChatTemplate::of(t).map_err(template_error)?,
            _ => None,
        };
        Ok(Encoder { tok, template, vocab_size })
    }

    /// The chat template in use, if any.
    pub fn template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// The ids of an input item (`label` names it in errors).
    pub fn encode(&self, label: &str, text: &str) -> Result<Vec<u32>> {
        let what = || label.to_string();
        let ids = match (self.tok, &self.template) {
            (Some(tok), Some(t)) => {
                tok.encode(&t.render(text).map_err(template_error)?, false).map_err(gemma4::Error::from)?
            }
            (Some(tok), None) => tok.encode(text, true).map_err(gemma4::Error::from)?,
            (None, _) => text
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|t| !t.is_empty())
                .map(|t| {
                    t.parse::<u32>().map_err(|_| Error::Invalid {
                        what: what(),
                        detail: format!("{t:?} is not a token id (without a tokenizer, inputs are token ids)"),
                    })
                })
                .collect::<Result<_>>()?,
        };
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= self.vocab_size) {
            return Err(Error::Invalid {
                what: what(),
                detail: format!("token id {bad} is outside the vocabulary of {}", self.vocab_size),
            });
        }
        if ids.is_empty() {
            return Err(Error::Invalid { what: what(), detail: format!("{text:?} encodes to no tokens") });
        }
        Ok(ids)
    }
}

/// First line of the ledger.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct LedgerHeader {
    format: String,
    version: u32,
    target: TargetId,
    tap_layers: Vec<usize>,
    mode: RegenMode,
}

/// One committed shard.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct LedgerEntry {
    shard: usize,
    /// Input item indices, in order.
    items: Vec<usize>,
    /// FNV-1a hashes of the items' text (hex), to notice a changed input file.
    hashes: Vec<String>,
    n_seq: usize,
    n_tokens: usize,
}

fn text_hash(s: &str) -> String {
    let h = s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    format!("{h:016x}")
}

fn shard_dir(out: &Path, index: usize) -> PathBuf {
    out.join(format!("shard_{index:05}"))
}

/// The ledger as lines; written whole to a temporary file, then renamed over the old one.
struct Ledger {
    path: PathBuf,
    lines: Vec<String>,
}

impl Ledger {
    /// Appends a line (by rewriting the whole file).
    fn push(&mut self, line: String) -> Result<()> {
        self.lines.push(line);
        self.save()
    }

    fn save(&self) -> Result<()> {
        mlx_core::files::write_atomic(&self.path, (self.lines.join("\n") + "\n").as_bytes())
            .map_err(|source| Error::Io { path: self.path.clone(), source })
    }
}

fn json_line<T: Serialize>(v: &T, path: &Path) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::State { path: path.to_path_buf(), detail: e.to_string() })
}

fn remove_dir(p: &Path) -> Result<()> {
    std::fs::remove_dir_all(p).map_err(|source| Error::Io { path: p.to_path_buf(), source })
}

/// The regen state of `out`: the ledger (created when missing), the items already committed
/// (index -> hash and shard), the next shard index, and how many orphan shards were removed.
struct Resume {
    ledger: Ledger,
    done: BTreeMap<usize, (String, usize)>,
    next_shard: usize,
    orphans_removed: usize,
}

fn prepare(out: &Path, header: &LedgerHeader, force: bool) -> Result<Resume> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    std::fs::create_dir_all(out).map_err(io(out))?;
    let ledger_path = out.join(LEDGER);
    let entries: Vec<PathBuf> = std::fs::read_dir(out).map_err(io(out))?.flatten().map(|e| e.path()).collect();
    let name = |p: &Path| p.file_name().and_then(|n| n.to_str()).unwrap_or("").to_string();
    // Staging directories and ledger temporaries of an interrupted run are never committed data.
    for p in &entries {
        let n = name(p);
        if n.starts_with(".shard_") && n.contains(".tmp-") && p.is_dir() {
            remove_dir(p)?;
        } else if n.starts_with(&format!(".{LEDGER}.tmp-")) {
            std::fs::remove_file(p).map_err(io(p))?;
        }
    }
    let is_shard = |p: &PathBuf| p.is_dir() && name(p).starts_with("shard_");
    if force {
        for p in entries.iter().filter(|p| is_shard(p)) {
            remove_dir(p)?;
        }
        if ledger_path.exists() {
            std::fs::remove_file(&ledger_path).map_err(io(&ledger_path))?;
        }
    } else {
        list_shards(out, Some((&header.target, &header.tap_layers)))?;
    }
    let header_line = json_line(header, &ledger_path)?;
    if !ledger_path.exists() {
        let visible = std::fs::read_dir(out).map_err(io(out))?.flatten().any(|e| !name(&e.path()).starts_with('.'));
        if visible && !force {
            return Err(Error::NeedsForce {
                what: format!("output directory {}", out.display()),
                detail: format!(
                    "it is not empty and holds no {LEDGER}, so it is not a regen directory (starting over must be forced)"
                ),
            });
        }
        let ledger = Ledger { path: ledger_path, lines: vec![header_line] };
        ledger.save()?;
        return Ok(Resume { ledger, done: BTreeMap::new(), next_shard: 0, orphans_removed: 0 });
    }

    let text = mlx_core::files::read_text(&ledger_path, mlx_core::files::LARGE_TEXT_LIMIT).map_err(io(&ledger_path))?;
    let at = |n: usize| format!("{}:{}", ledger_path.display(), n + 1);
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let Some((n0, first)) = lines.next() else {
        return Err(Error::NeedsForce {
            what: at(0),
            detail: "the ledger is empty (starting over must be forced)".into(),
        });
    };
    let old: LedgerHeader = serde_json::from_str(first)
        .map_err(|e| Error::Invalid { what: at(n0), detail: format!("not a regen ledger header: {e}") })?;
    if old.format != LEDGER_FORMAT || old.version != LEDGER_VERSION {
        return Err(Error::Invalid {
            what: at(n0),
            detail: format!(
                "format {:?} version {}, expected {LEDGER_FORMAT:?} version {LEDGER_VERSION}",
                old.format, old.version
            ),
        });
    }
    for (field, same, was, now) in [
        ("a target of", old.target == header.target, old.target.to_string(), header.target.to_string()),
        (
            "taps",
            old.tap_layers == header.tap_layers,
            format!("{:?}", old.tap_layers),
            format!("{:?}", header.tap_layers),
        ),
        ("settings:", old.mode == header.mode, old.mode.to_string(), header.mode.to_string()),
    ] {
        if !same {
            return Err(Error::NeedsForce {
                what: at(n0),
                detail: format!(
                    "this directory was regenerated with {field} {was}, this run asks for {now} (use the same \
                     settings, another output directory, or start over, forced)"
                ),
            });
        }
    }
    let mut kept = vec![header_line];
    let mut done = BTreeMap::new();
    let mut named = Vec::new();
    let entries_text: Vec<(usize, &str)> = lines.collect();
    let last = entries_text.len().checked_sub(1);
    // A write cut short (a crash, a full disk) leaves the last line torn: no newline after it
    // and not a whole entry. It is dropped, and its shard, no longer named, is removed below as
    // an orphan and regenerated. A bad line anywhere else is damage, not an interruption.
    let torn_tail = !text.ends_with('\n');
    for (k, (n, line)) in entries_text.into_iter().enumerate() {
        let e: LedgerEntry = match serde_json::from_str(line) {
            Ok(e) => e,
            Err(_) if torn_tail && Some(k) == last => break,
            Err(err) => return Err(Error::Invalid { what: at(n), detail: format!("not a ledger entry: {err}") }),
        };
        if e.items.len() != e.hashes.len() || named.contains(&e.shard) {
            return Err(Error::NeedsForce {
                what: at(n),
                detail: format!("entry of shard {} is inconsistent (starting over must be forced)", e.shard),
            });
        }
        // A shard the ledger names but that is gone: its items are regenerated.
        if !shard_dir(out, e.shard).is_dir() {
            continue;
        }
        for (&i, h) in e.items.iter().zip(&e.hashes) {
            done.insert(i, (h.clone(), e.shard));
        }
        named.push(e.shard);
        kept.push(line.to_string());
    }
    // Shards committed after the last ledger line (an interrupted run): not recorded, so removed
    // and regenerated.
    let mut orphans_removed = 0;
    for p in entries.iter().filter(|p| is_shard(p)) {
        let index = name(p).strip_prefix("shard_").and_then(|s| s.parse::<usize>().ok());
        if !matches!(index, Some(i) if named.contains(&i)) {
            remove_dir(p)?;
            orphans_removed += 1;
        }
    }
    let next_shard = named.iter().max().map_or(0, |m| m + 1);
    // Rewritten without the entries of vanished shards, so shard numbers stay unique.
    let ledger = Ledger { path: ledger_path, lines: kept };
    ledger.save()?;
    Ok(Resume { ledger, done, next_shard, orphans_removed })
}

/// Regenerates training data for `inputs` (prompts, or documents in [`RegenMode::FromText`])
/// into shards under `out`, resuming from its ledger (see the module docs). `progress` is called
/// at the start and after every item.
pub fn regen(
    model: &Model,
    tok: Option<&Tokenizer>,
    inputs: &[String],
    out: &Path,
    opts: &RegenOptions,
    mut progress: impl FnMut(RegenProgress),
) -> Result<RegenSummary> {
    let t0 = Instant::now();
    let cfg = model.config();
    let layers = cfg.num_hidden_layers;
    validate_taps(&opts.taps, layers)?;
    if opts.seqs_per_shard == 0 {
        return Err(Error::Invalid { what: "seqs_per_shard".into(), detail: "must be at least 1".into() });
    }
    match opts.mode {
        RegenMode::Generate { max_new, temperature, .. } => {
            if max_new == 0 {
                return Err(Error::Invalid { what: "max_new".into(), detail: "must be at least 1".into() });
            }
            if !(temperature.is_finite() && temperature >= 0.0) {
                return Err(Error::Invalid {
                    what: "temperature".into(),
                    detail: format!("{temperature} is not a finite number >= 0"),
                });
            }
        }
        RegenMode::FromText { max_len } if max_len < 2 => {
            return Err(Error::Invalid {
                what: "max_len".into(),
                detail: format!("{max_len}: a piece needs at least 2 tokens (a context and one anchor)"),
            });
        }
        RegenMode::FromText { .. } => {}
    }
    let chat = matches!(opts.mode, RegenMode::Generate { .. }) && !opts.plain_prompts;
    let encoder = Encoder::new(tok, cfg.vocab_size, chat)?;
    let target = TargetId::of(cfg);
    let header = LedgerHeader {
        format: LEDGER_FORMAT.into(),
        version: LEDGER_VERSION,
        target: target.clone(),
        tap_layers: opts.taps.clone(),
        mode: opts.mode.clone(),
    };
    let _lock = crate::lock::DirLock::acquire(out, "regen")?;
    let mut resume = prepare(out, &header, opts.force)?;
    let done = std::mem::take(&mut resume.done);
    for (&i, (h, shard)) in &done {
        let shard = shard_dir(out, *shard);
        let Some(text) = inputs.get(i) else {
            return Err(Error::NeedsForce {
                what: format!("input item {i}"),
                detail: format!(
                    "{} holds item {i}, but there are only {} items now (the input file changed: start over, forced, or write \
                     elsewhere)",
                    shard.display(),
                    inputs.len()
                ),
            });
        };
        if text_hash(text) != *h {
            return Err(Error::NeedsForce {
                what: opts.label(i),
                detail: format!(
                    "differs from item {i} that {} was regenerated from (the input file changed: start over, forced, or write \
                     elsewhere)",
                    shard.display()
                ),
            });
        }
    }
    let taps = tap_set(&opts.taps, layers);
    let stops = stop_tokens(cfg, tok);
    let mut st = RegenProgress { total: inputs.len(), ..Default::default() };
    let mut sum = RegenSummary { orphans_removed: resume.orphans_removed, ..Default::default() };
    let (mut pending, mut pending_items): (Vec<Sequence>, Vec<usize>) = (Vec::new(), Vec::new());
    let mut next_shard = resume.next_shard;

    let tapped = |ids: &[u32]| -> Result<mlx_core::Array> {
        let out = model.forward_tapped(&ids_array(ids)?, None, &taps)?;
        let rows = out.taps.ok_or_else(|| Error::Mismatch {
            what: "tapped forward",
            detail: format!("the target returned no taps for {:?}", opts.taps),
        })?;
        let rows = rows.squeeze(0)?.astype(Dtype::Bf16)?;
        rows.eval()?;
        Ok(rows)
    };
    let mut flush = |pending: &mut Vec<Sequence>, items: &mut Vec<usize>, st: &mut RegenProgress| -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        write_shard(out, next_shard, &target, &opts.taps, pending)?;
        let entry = LedgerEntry {
            shard: next_shard,
            hashes: items.iter().map(|&i| text_hash(&inputs[i])).collect(),
            items: std::mem::take(items),
            n_seq: pending.len(),
            n_tokens: pending.iter().map(|s| s.ids.len()).sum(),
        };
        resume.ledger.push(json_line(&entry, &resume.ledger.path)?)?;
        pending.clear();
        next_shard += 1;
        st.shards += 1;
        Ok(())
    };

    st.skipped = inputs.iter().enumerate().filter(|(i, _)| done.contains_key(i)).count();
    st.done = st.skipped;
    st.elapsed = t0.elapsed();
    progress(st.clone());
    for (i, text) in inputs.iter().enumerate() {
        if done.contains_key(&i) {
            continue;
        }
        let seqs = match opts.mode {
            RegenMode::Generate { max_new, temperature, seed } => {
                let prompt = encoder.encode(&opts.label(i), text)?;
                let gcfg = GenerateConfig {
                    max_tokens: max_new,
                    sampler: SamplerConfig { temperature, ..SamplerConfig::default() },
                    seed: seed.wrapping_add(i as u64),
                    stop_tokens: stops.clone(),
                    ..GenerateConfig::default()
                };
                let gen = generate(model, &prompt, &gcfg, |_| {})?;
                let ids = [prompt.as_slice(), &gen.tokens].concat();
                vec![Sequence { rows: tapped(&ids)?, resp_start: prompt.len(), ids }]
            }
            RegenMode::FromText { max_len } => encoder
                .encode(&opts.label(i), text)?
                .chunks(max_len)
                .filter(|c| c.len() >= 2)
                .map(|c| Ok(Sequence { rows: tapped(c)?, resp_start: 1, ids: c.to_vec() }))
                .collect::<Result<Vec<_>>>()?,
        };
        st.sequences += seqs.len();
        st.tokens += seqs.iter().map(|s| s.ids.len()).sum::<usize>();
        pending.extend(seqs);
        pending_items.push(i);
        if pending.len() >= opts.seqs_per_shard {
            flush(&mut pending, &mut pending_items, &mut st)?;
        }
        st.done += 1;
        st.elapsed = t0.elapsed();
        progress(st.clone());
    }
    flush(&mut pending, &mut pending_items, &mut st)?;
    st.elapsed = t0.elapsed();
    progress(st.clone());
    sum.sequences = st.sequences;
    sum.tokens = st.tokens;
    sum.shards = st.shards;
    sum.skipped = st.skipped;
    sum.elapsed = st.elapsed;
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_taps_spread_and_end_with_the_final_norm() {
        assert_eq!(default_taps(6), [1, 3, 4, 6]);
        assert_eq!(default_taps(48), [12, 24, 36, 48]);
        assert_eq!(default_taps(1), [0, 1]);
        for l in 1..64 {
            validate_taps(&default_taps(l), l).unwrap();
        }
    }
}
