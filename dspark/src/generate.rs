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
    temperature: f32,
    /// Nucleus sampling mass (0 or 1 disables).
    #[arg(long, default_value_t = 0.0)]
    top_p: f32,
    /// Keep only the k most likely tokens (0 disables).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Min-p filter relative to the top token (0 disables).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// cpu or gpu (Metal on Apple Silicon, CUDA with the mlx-cuda wheels).
    #[arg(long, default_value = "cpu")]
    device: Device,
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
        (None, Some(p), Some(tok)) => tok.encode(p.as_str(), true).map_err(|e| anyhow::anyhow!("encoding the prompt: {e}"))?.get_ids().to_vec(),
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
        sampler: SamplerConfig { temperature: a.temperature, top_p: a.top_p, top_k: a.top_k, min_p: a.min_p, min_tokens_to_keep: 1 },
        seed: a.seed,
        prefill_step: 2048,
        stop_tokens: if a.ignore_eos { vec![] } else { model.config().eos_token_ids.clone() },
    };
    let mut out = std::io::stdout().lock();
    let mut ids: Vec<u32> = Vec::new();
    let mut printed = String::new();
    let mut err: Option<anyhow::Error> = None;
    let gen = generate(&model, &prompt, &cfg, |t| {
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
    })?;
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
        match gen.finish {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    );
    Ok(())
}
