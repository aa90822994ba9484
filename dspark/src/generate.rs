//! `dspark generate`: plain or speculative decoding with streaming output and a stats line,
//! through the same [`engine::Session`] the server decodes with.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use engine::args::{ComputeArgs, DrafterArg, TargetArg};
use engine::chat::{chat_ids, text_ids, user_message};
use engine::{Request, Session};
use gemma4::chat_template::ChatTemplate;
use gemma4::generate::{generate, GenerateConfig};
use gemma4::sampling::SamplerConfig;
use gemma4::tokenizer::{stop_tokens, Tokenizer};
use gemma4::Model;

/// Arguments of `dspark generate`. Numeric options accept negative values at parse time so the
/// range checks can say what is allowed.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: TargetArg,
    /// Prompt text (encoded with the checkpoint's tokenizer.json). Default: "def fibonacci(n):".
    #[arg(long, conflicts_with_all = ["tokens", "prompt_file"])]
    prompt: Option<String>,
    /// Read the prompt text from this file (`-` for standard input), newlines and all.
    #[arg(long, conflicts_with = "tokens")]
    prompt_file: Option<PathBuf>,
    /// Prompt as raw token ids, comma- or space-separated; output is printed as ids.
    #[arg(long)]
    tokens: Option<String>,
    /// Maximum tokens to generate.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0, value_parser = engine::args::temperature, allow_negative_numbers = true)]
    temperature: f64,
    /// Nucleus sampling mass (0 or 1 disables).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    top_p: f64,
    /// Keep only the k most likely tokens (0 disables).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    top_k: usize,
    /// Min-p filter relative to the top token (0 disables).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    min_p: f64,
    /// Add BIAS, in [-100, 100], to token ID's logit before temperature and the filters, as
    /// OpenAI's `logit_bias` (repeatable; +100 all but forces the token, -100 bans it).
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_logit_bias, allow_negative_numbers = true)]
    logit_bias: Vec<(u32, f32)>,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    seed: u64,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    #[command(flatten)]
    compute: ComputeArgs,
    #[command(flatten)]
    drafter: DrafterArg,
    /// Drafts per round (default: the drafter's block size). Needs a drafter.
    #[arg(long, allow_negative_numbers = true)]
    gamma: Option<usize>,
    /// Prune each draft block at the first position whose confidence is below this. Needs a
    /// drafter.
    #[arg(long, conflicts_with = "calibrated", allow_negative_numbers = true)]
    min_conf: Option<f32>,
    /// Prune with the drafter checkpoint's calibrated per-position thresholds. Needs a drafter.
    #[arg(long)]
    calibrated: bool,
    /// How many drafts a round verifies: `throughput` weighs calibrated survivals against the
    /// measured verify cost (`dspark calibrate`, `dspark profile`); `full` verifies the whole
    /// block; `auto` is throughput when both are available. Needs a drafter.
    #[arg(long, value_enum, default_value = "auto")]
    schedule: crate::schedule::Schedule,
    /// Render --prompt as a one-message user conversation, as `dspark serve`'s
    /// /v1/chat/completions does (the tokenizer's chat template, if it has one).
    #[arg(long)]
    chat: bool,
    /// Stop before the first occurrence of this text in the output (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Also run plain decoding on the same prompt and report both speeds. Needs a drafter.
    #[arg(long)]
    compare: bool,
}

fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().with_context(|| format!("--tokens: {t:?} is not a token id")))
        .collect()
}

/// One `--logit-bias ID=BIAS` (the range and duplicates are the sampler's checks).
fn parse_logit_bias(s: &str) -> std::result::Result<(u32, f32), String> {
    let (id, bias) = s.split_once('=').ok_or_else(|| format!("expected ID=BIAS, got {s:?}"))?;
    let id = id.trim().parse::<u32>().map_err(|_| format!("{id:?} is not a token id"))?;
    let bias = bias.trim().parse::<f32>().map_err(|_| format!("{bias:?} is not a number"))?;
    Ok((id, bias))
}

/// The most prompt text `--prompt-file` reads: far beyond any context, small enough to refuse
/// an endless device or a wrong file before it fills memory.
const MAX_PROMPT_BYTES: u64 = 64 << 20;

/// Reads `--prompt-file` (`-`: standard input) as UTF-8 text. Opened as given, so a pipe
/// (`<(…)`) works too; the size bound is what keeps an endless source out.
fn read_prompt_file(path: &std::path::Path) -> Result<String> {
    let text = if path.as_os_str() == "-" {
        mlx_core::files::read_text_from(std::io::stdin().lock(), MAX_PROMPT_BYTES)
    } else {
        std::fs::File::open(path).and_then(|f| mlx_core::files::read_text_from(f, MAX_PROMPT_BYTES))
    };
    let what = if path.as_os_str() == "-" { "standard input".to_string() } else { path.display().to_string() };
    text.with_context(|| format!("--prompt-file: cannot read {what}"))
}

/// Runs the subcommand: flags are checked first, then the model (and drafter) load, and the
/// continuation streams to stdout with stats on stderr.
pub fn run(a: Args) -> Result<()> {
    let sampler = SamplerConfig {
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        min_p: a.min_p,
        min_tokens_to_keep: 1,
        logit_bias: a.logit_bias.clone(),
    };
    // Ranges first, before anything is loaded or written (top_k is checked against the
    // vocabulary once the model is loaded).
    sampler.validate_ranges()?;
    let parsed_tokens = a.tokens.as_deref().map(parse_ids).transpose()?;
    let prompt_text = match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(f)) => Some(read_prompt_file(f)?),
        (None, None) => None,
    };
    if a.chat && prompt_text.is_none() {
        bail!("--chat renders a text prompt as a chat message; give --prompt or --prompt-file");
    }
    // The default model comes with its drafter; `--drafter none` decodes plainly.
    let drafter_arg = crate::paths::drafter_choice(a.target.model.as_deref(), a.drafter.drafter.as_deref());
    if drafter_arg.is_none() {
        for (set, flag) in [
            (a.gamma.is_some(), "--gamma"),
            (a.min_conf.is_some(), "--min-conf"),
            (a.calibrated, "--calibrated"),
            (a.schedule == crate::schedule::Schedule::Throughput, "--schedule throughput"),
            (a.compare, "--compare"),
        ] {
            if set {
                bail!("{flag} needs a drafter (--drafter DIR, or the default model's own drafter)");
            }
        }
    }
    let dir = crate::paths::select_target(a.target.model.as_deref(), drafter_arg, a.compute.device)?;
    let (model, resolved) = Model::load_as(&dir, a.compute.dtype, a.compute.device)
        .with_context(|| format!("loading the model in {}", dir.display()))?;
    eprintln!("dspark: loaded {} computing in {}", dir.display(), resolved.describe());
    if let Err(e) = gemma4::sampling::check_top_k(a.top_k, model.config().vocab_size) {
        bail!("--top-k: {e}");
    }
    if let Err(e) = gemma4::sampling::check_logit_bias(&sampler.logit_bias, Some(model.config().vocab_size)) {
        bail!("--logit-bias: {e}");
    }
    // Text prompts need the tokenizer; with --tokens it is only read (if the checkpoint has
    // one) for the end-of-sequence fallback when the config names no eos ids.
    let needs_tokenizer = a.tokens.is_none()
        || (!a.ignore_eos && model.config().eos_token_ids.is_empty() && dir.join("tokenizer.json").is_file());
    let tokenizer = if needs_tokenizer { Some(Tokenizer::from_dir(&dir)?) } else { None };
    let prompt: Vec<u32> = match (parsed_tokens, &prompt_text, &tokenizer) {
        (Some(t), _, _) => t,
        (None, Some(p), Some(tok)) if a.chat => {
            let template = ChatTemplate::of(tok)?;
            chat_ids(tok, template.as_ref(), &user_message(p))?
        }
        (None, Some(p), Some(tok)) => text_ids(tok, p)?,
        (None, None, Some(tok)) => {
            let default = "def fibonacci(n):";
            eprintln!("dspark: no --prompt given, using {default:?}");
            tok.encode(default, true)?
        }
        _ => bail!("give --prompt, --prompt-file or --tokens"),
    };
    if prompt.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    let cfg = GenerateConfig {
        max_tokens: a.max_tokens,
        sampler,
        seed: a.seed,
        prefill_step: 2048,
        stop_tokens: if a.ignore_eos { vec![] } else { stop_tokens(model.config(), tokenizer.as_ref()) },
    };
    let drafter = match drafter_arg {
        None => None,
        Some("self") => {
            Some(Box::new(spec_decode::oracle::SelfDrafter::new(a.gamma.unwrap_or(4))) as Box<dyn spec_decode::Drafter>)
        }
        Some(d) => {
            let ddir = crate::paths::drafter_dir(d)?;
            eprintln!("dspark: loading drafter {}", ddir.display());
            Some(
                spec_decode::loader::load_drafter_as(&ddir, model.config(), resolved.conversion.dequantize)
                    .with_context(|| format!("loading the drafter in {}", ddir.display()))?,
            )
        }
    };
    // Output is text for a text prompt and ids for an id prompt (even when the tokenizer was
    // read for its eos token).
    let text_out = if a.tokens.is_none() { tokenizer.as_ref() } else { None };
    if !a.stop.is_empty() && text_out.is_none() {
        bail!("--stop matches decoded text; it needs a text --prompt");
    }
    let manual_pruning = a.min_conf.is_some() || a.calibrated;
    let manual = match (a.min_conf, a.calibrated) {
        (Some(c), _) => Some(spec_decode::Pruning::MinConf(c)),
        (None, true) => Some(spec_decode::Pruning::Calibrated),
        (None, false) => None,
    };
    let pruning = match &drafter {
        Some(d) => {
            let greedy = cfg.sampler.is_greedy();
            let (p, line) =
                crate::schedule::choose(a.schedule, manual, d.as_ref(), &model, &dir, a.compute.device, greedy)?;
            eprintln!("dspark: {line}");
            p
        }
        None => spec_decode::Pruning::Off,
    };
    let req = Request {
        prompt: prompt.clone(),
        generate: cfg.clone(),
        stop: a.stop.clone(),
        gamma: a.gamma,
        pruning,
        kept_tokens: Vec::new(),
        seeded: true,
        // `auto` (with or without a profile) may take plain steps where drafting has not paid.
        adaptive: a.schedule == crate::schedule::Schedule::Auto && !manual_pruning,
    };
    // The server's decoding path: the same session type, run to the end here.
    let mut drafter = drafter;
    if a.compare {
        // Warm up (first-call allocations and kernel set-up) so neither timed run pays for it.
        generate(&model, &prompt, &GenerateConfig { max_tokens: 2, ..cfg.clone() }, |_| {})?;
    }
    let session = Session::start(&model, drafter.as_deref_mut(), &req, text_out, None)?;
    let mut out = std::io::stdout().lock();
    let mut printed = 0usize;
    let res = session.run(drafter.as_deref_mut(), |step| {
        let piece = match text_out {
            Some(_) => step.text.clone(),
            None => step
                .tokens
                .iter()
                .map(|t| {
                    printed += 1;
                    format!("{}{t}", if printed > 1 { " " } else { "" })
                })
                .collect(),
        };
        let _ = write!(out, "{piece}");
        let _ = out.flush();
    })?;
    writeln!(out)?;
    match (&drafter, &res.speculation) {
        (Some(d), Some(stats)) => {
            let gamma = spec_decode::SpecConfig { gamma: a.gamma, ..Default::default() }.gamma_for(d.as_ref())?;
            eprintln!("drafter: {} | γ {gamma} | finish: {}", d.name(), res.finish.as_str());
            eprintln!("{}", stats.summary());
            eprintln!("accepted/drafted by block position: {}", stats.by_position());
            if a.compare {
                let plain = generate(&model, &prompt, &cfg, |_| {})?;
                let same = plain.tokens == res.tokens;
                // End to end (prompt processing included) for both, so the two loops' different
                // splits of prefill and first token do not skew the ratio.
                let plain_ms = plain.stats.prefill_ms + plain.stats.decode_ms;
                let spec_ms = stats.prefill_ms + stats.decode_ms;
                let rate = |n: usize, ms: f64| n as f64 / (ms / 1e3).max(1e-9);
                // A ratio of times is a speedup only when both runs produced tokens (an
                // end-of-sequence first token makes both runs a prefill).
                let speedup = if plain.tokens.is_empty() || res.tokens.is_empty() {
                    "speedup n/a (a run generated no tokens)".to_string()
                } else {
                    format!("speedup {:.2}x", plain_ms / spec_ms.max(1e-9))
                };
                eprintln!(
                    "end to end, {} prompt + {} generated tokens: plain {plain_ms:.1} ms ({:.1} tok/s) | speculative {spec_ms:.1} ms ({:.1} tok/s) | {speedup} | outputs identical: {same}",
                    prompt.len(),
                    res.tokens.len(),
                    rate(plain.tokens.len(), plain_ms),
                    rate(res.tokens.len(), spec_ms),
                );
                if cfg.sampler.is_greedy() && !same {
                    bail!("greedy speculative output differs from plain greedy output");
                }
            }
        }
        _ => {
            let prefill_rate = res.prompt_tokens as f64 / (res.prefill_ms / 1e3).max(1e-9);
            eprintln!(
                "prompt: {} tokens, {:.1} ms ({prefill_rate:.0} tok/s) | generated: {} tokens, {:.1} tok/s | finish: {}",
                res.prompt_tokens,
                res.prefill_ms,
                res.tokens.len(),
                res.tok_per_s(),
                res.finish.as_str()
            );
        }
    }
    Ok(())
}
