//! `dspark generate`: plain decoding with streaming output and a stats line.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use gemma4::generate::{generate, FinishReason, GenerateConfig};
use gemma4::sampling::SamplerConfig;
use gemma4::Model;
use mlx_core::Device;
use tokenizers::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (config.json, model*.safetensors, tokenizer.json). Default: the
    /// embedded tiny model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt text (encoded with the checkpoint's tokenizer.json).
    #[arg(long, conflicts_with = "tokens")]
    prompt: Option<String>,
    /// Prompt as raw token ids, comma- or space-separated; output is printed as ids.
    #[arg(long)]
    tokens: Option<String>,
    /// Maximum tokens to generate.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Nucleus sampling mass (0 or 1 disables).
    #[arg(long, default_value_t = 0.0)]
    top_p: f64,
    /// Keep only the k most likely tokens (0 disables).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Min-p filter relative to the top token (0 disables).
    #[arg(long, default_value_t = 0.0)]
    min_p: f64,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// cpu or gpu (Metal on Apple Silicon, CUDA with the mlx-cuda wheels).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// Speculative decoding with this drafter: a DSpark (dspark.json) or DeepSpec
    /// (Gemma4DSparkModel) checkpoint directory, `default` for the embedded default drafter, or
    /// `self` (the target drafting for itself; a test drafter). Absent: plain decoding.
    #[arg(long)]
    drafter: Option<String>,
    /// Drafts per round (default: the drafter's block size).
    #[arg(long)]
    gamma: Option<usize>,
    /// Prune each draft block at the first position whose confidence is below this.
    #[arg(long, conflicts_with = "calibrated")]
    min_conf: Option<f32>,
    /// Prune with the drafter checkpoint's calibrated per-position thresholds.
    #[arg(long)]
    calibrated: bool,
    /// Also run plain decoding on the same prompt and report both speeds.
    #[arg(long, requires = "drafter")]
    compare: bool,
}

/// The id of tokenizer_config.json's `eos_token` (a string or `{"content": …}`), if any; the
/// tokenizer is read from `dir` when the prompt did not need it (`--tokens`).
fn tokenizer_eos(dir: &std::path::Path, tok: Option<&Tokenizer>) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join("tokenizer_config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let eos = &v["eos_token"];
    let name = eos.as_str().or_else(|| eos["content"].as_str())?;
    match tok {
        Some(t) => t.token_to_id(name),
        None => Tokenizer::from_file(dir.join("tokenizer.json")).ok()?.token_to_id(name),
    }
}

fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().with_context(|| format!("--tokens: {t:?} is not a token id")))
        .collect()
}

pub fn run(a: Args) -> Result<()> {
    if !a.device.is_available() {
        bail!("--device {:?}: this MLX build has no such backend (MLX at {})", a.device, mlx_core::MLX_DIR);
    }
    a.device.set_default()?;
    let dir = match &a.model {
        Some(d) => d.clone(),
        None => crate::default_model::ensure(false)?,
    };
    eprintln!("dspark: loading {}", dir.display());
    let model = Model::load(&dir).with_context(|| format!("loading the model in {}", dir.display()))?;
    let tokenizer_path = dir.join("tokenizer.json");
    let tokenizer = if a.tokens.is_none() {
        Some(Tokenizer::from_file(&tokenizer_path).map_err(|e| anyhow::anyhow!("{}: {e}", tokenizer_path.display()))?)
    } else {
        None
    };
    let prompt: Vec<u32> = match (&a.tokens, &a.prompt, &tokenizer) {
        (Some(t), _, _) => parse_ids(t)?,
        (None, Some(p), Some(tok)) => {
            tok.encode(p.as_str(), true).map_err(|e| anyhow::anyhow!("encoding the prompt: {e}"))?.get_ids().to_vec()
        }
        (None, None, Some(tok)) => {
            let default = "t5 t6 t7 t8";
            eprintln!("dspark: no --prompt given, using {default:?}");
            tok.encode(default, true).map_err(|e| anyhow::anyhow!("encoding the prompt: {e}"))?.get_ids().to_vec()
        }
        _ => bail!("give --prompt or --tokens"),
    };
    if prompt.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    let cfg = GenerateConfig {
        max_tokens: a.max_tokens,
        sampler: SamplerConfig {
            temperature: a.temperature,
            top_p: a.top_p,
            top_k: a.top_k,
            min_p: a.min_p,
            min_tokens_to_keep: 1,
        },
        seed: a.seed,
        prefill_step: 2048,
        stop_tokens: match (a.ignore_eos, model.config().eos_token_ids.is_empty()) {
            (true, _) => vec![],
            (false, false) => model.config().eos_token_ids.clone(),
            // As mlx-lm: without eos ids in the config, the tokenizer's eos token stops.
            (false, true) => tokenizer_eos(&dir, tokenizer.as_ref()).into_iter().collect(),
        },
    };
    let drafter = match a.drafter.as_deref() {
        None => None,
        Some("self") => {
            Some(Box::new(spec_decode::oracle::SelfDrafter::new(a.gamma.unwrap_or(4))) as Box<dyn spec_decode::Drafter>)
        }
        Some(d) => {
            let ddir = if d == "default" {
                if a.model.is_some() {
                    bail!(
                        "--drafter default belongs to the embedded default model; pass a drafter directory for --model"
                    );
                }
                crate::default_model::ensure_drafter(&dir, false)?
            } else {
                PathBuf::from(d)
            };
            eprintln!("dspark: loading drafter {}", ddir.display());
            Some(
                spec_decode::loader::load_drafter(&ddir, model.config())
                    .with_context(|| format!("loading the drafter in {}", ddir.display()))?,
            )
        }
    };
    let mut out = std::io::stdout().lock();
    let mut ids: Vec<u32> = Vec::new();
    let mut printed = String::new();
    let mut err: Option<anyhow::Error> = None;
    let mut emit = |t: u32| {
        ids.push(t);
        let piece = match &tokenizer {
            None => format!("{}{t}", if ids.len() > 1 { " " } else { "" }),
            Some(tok) => match tok.decode(&ids, true) {
                // Print only what is new: decoding a growing id list keeps multi-byte pieces whole.
                Ok(text) if text.starts_with(&printed) => {
                    let new = text[printed.len()..].to_string();
                    printed = text;
                    new
                }
                Ok(text) => {
                    printed = text;
                    String::new()
                }
                Err(e) => {
                    err.get_or_insert(anyhow::anyhow!("decoding: {e}"));
                    String::new()
                }
            },
        };
        let _ = write!(out, "{piece}");
        let _ = out.flush();
    };
    if let Some(mut drafter) = drafter {
        let spec = spec_decode::SpecConfig {
            generate: cfg.clone(),
            gamma: a.gamma,
            pruning: match (a.min_conf, a.calibrated) {
                (Some(c), _) => spec_decode::Pruning::MinConf(c),
                (None, true) => spec_decode::Pruning::Calibrated,
                (None, false) => spec_decode::Pruning::Off,
            },
        };
        let res = spec_decode::speculative_generate(&model, drafter.as_mut(), &prompt, &spec, &mut emit)?;

        writeln!(out)?;
        if let Some(e) = err {
            return Err(e);
        }
        eprintln!(
            "drafter: {} | γ {} | finish: {}",
            drafter.name(),
            spec.gamma_for(drafter.as_ref())?,
            finish_name(res.finish)
        );
        eprintln!("{}", res.stats.summary());
        eprintln!("accepted/drafted by block position: {}", res.stats.by_position());
        if a.compare {
            let plain = generate(&model, &prompt, &cfg, |_| {})?;
            let same = plain.tokens == res.tokens;
            // End to end (prompt processing included) for both, so the two loops' different
            // splits of prefill and first token do not skew the ratio.
            let plain_ms = plain.stats.prefill_ms + plain.stats.decode_ms;
            let spec_ms = res.stats.prefill_ms + res.stats.decode_ms;
            let rate = |n: usize, ms: f64| n as f64 / (ms / 1e3).max(1e-9);
            eprintln!(
                "end to end, {} prompt + {} generated tokens: plain {plain_ms:.1} ms ({:.1} tok/s) | speculative {spec_ms:.1} ms ({:.1} tok/s) | speedup {:.2}x | outputs identical: {same}",
                prompt.len(),
                res.tokens.len(),
                rate(plain.tokens.len(), plain_ms),
                rate(res.tokens.len(), spec_ms),
                plain_ms / spec_ms.max(1e-9)
            );
            if cfg.sampler.is_greedy() && !same {
                bail!("greedy speculative output differs from plain greedy output");
            }
        }
        return Ok(());
    }
    let gen = generate(&model, &prompt, &cfg, &mut emit)?;

    writeln!(out)?;
    if let Some(e) = err {
        return Err(e);
    }
    let s = &gen.stats;
    eprintln!(
        "prompt: {} tokens, {:.1} ms ({:.0} tok/s) | generated: {} tokens, {:.1} tok/s | finish: {}",
        s.prompt_tokens,
        s.prefill_ms,
        s.prefill_tok_per_s(),
        s.generated_tokens,
        s.decode_tok_per_s(),
        finish_name(gen.finish)
    );
    Ok(())
}

fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}
