//! `dspark train-target`: trains a small Gemma-4 from scratch on the Python standard library's
//! source — the corpus every machine with Python 3 has — with a byte-level BPE tokenizer
//! trained on the same training split. Writes a complete checkpoint directory (config.json,
//! model.safetensors, tokenizer.json, tokenizer_config.json, the PSF notice, train_report.json).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use train::bpe::{train_bpe, SPECIALS};
use train::corpus::{list_sources, read_split, stdlib_dir, Split};
use train::target_checkpoint::{byte_bigram_bits_per_byte, shipped_model, write_target_checkpoint};
use train::target_train::{init_params, small_config, train_target, TargetTrainConfig};

/// Arguments of `dspark train-target`.
#[derive(clap::Args)]
pub struct Args {
    /// Output checkpoint directory.
    #[arg(long)]
    out: PathBuf,
    /// Replace an existing --out.
    #[arg(long)]
    force: bool,
    /// The Python whose standard library is the corpus.
    #[arg(long, default_value = "python3")]
    python: String,
    /// BPE vocabulary size (specials included).
    #[arg(long, default_value_t = 4096, allow_negative_numbers = true)]
    vocab: usize,
    #[arg(long, default_value_t = 256, allow_negative_numbers = true)]
    hidden: usize,
    #[arg(long, default_value_t = 6, allow_negative_numbers = true)]
    layers: usize,
    #[arg(long, default_value_t = 4, allow_negative_numbers = true)]
    heads: usize,
    /// Sliding-window size of the sliding layers.
    #[arg(long, default_value_t = 128, allow_negative_numbers = true)]
    window: usize,
    /// Tokens per training sequence.
    #[arg(long, default_value_t = 256, allow_negative_numbers = true)]
    seq_len: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 8, allow_negative_numbers = true)]
    batch: usize,
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true)]
    steps: u64,
    /// Peak learning rate (AdamW, warmup then cosine to 10%).
    #[arg(long, default_value_t = 3e-3, allow_negative_numbers = true)]
    lr: f64,
    #[arg(long, default_value_t = 50, allow_negative_numbers = true)]
    warmup: u64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Validation every N steps.
    #[arg(long, default_value_t = 100, allow_negative_numbers = true)]
    eval_every: u64,
}

/// The prompts of the three greedy continuations in the report.
const SAMPLE_PROMPTS: [&str; 3] = ["def fibonacci(n):", "import os\n\n\ndef ", "class Stack:\n"];

/// A settings error worded with the flag that sets the field (`seq_len` → `--seq-len`).
fn flag_error(e: train::Error) -> String {
    match e {
        train::Error::Invalid { what, detail } => format!("--{} {detail}", what.replace('_', "-")),
        other => other.to_string(),
    }
}

pub fn run(a: Args) -> Result<()> {
    if a.out.exists() && !a.force {
        bail!("--out {} exists; pass --force to replace it", a.out.display());
    }
    // Every flag and the config they imply are checked before the corpus is read and the
    // tokenizer trained (tens of seconds).
    let tc = TargetTrainConfig {
        steps: a.steps,
        batch: a.batch,
        seq_len: a.seq_len,
        lr: a.lr,
        warmup: a.warmup,
        seed: a.seed,
        eval_every: a.eval_every,
        ..Default::default()
    };
    tc.validate().map_err(|e| anyhow::anyhow!("{}", flag_error(e)))?;
    if a.vocab < 256 + SPECIALS.len() {
        bail!("--vocab {}: a byte-level BPE needs at least {} tokens", a.vocab, 256 + SPECIALS.len());
    }
    small_config(a.vocab, a.hidden, a.layers, a.heads, a.window).map_err(|e| {
        anyhow::anyhow!("--hidden {} --layers {} --heads {} --window {}: {e}", a.hidden, a.layers, a.heads, a.window)
    })?;
    let root = stdlib_dir(Some(&a.python))?;
    let files = list_sources(&root)?;
    let train_docs = read_split(&files, Split::Train);
    let val_docs = read_split(&files, Split::Validation);
    let (tr_bytes, va_bytes): (usize, usize) =
        (train_docs.iter().map(|d| d.1.len()).sum(), val_docs.iter().map(|d| d.1.len()).sum());
    eprintln!(
        "dspark: corpus {} — {} train files ({:.1} MB), {} validation files ({:.1} MB)",
        root.display(),
        train_docs.len(),
        tr_bytes as f64 / 1e6,
        val_docs.len(),
        va_bytes as f64 / 1e6
    );
    let t0 = std::time::Instant::now();
    let tk = train_bpe(train_docs.iter().map(|d| d.1.as_str()), a.vocab).context("training the tokenizer")?;
    let vocab = tk.get_vocab_size(true);
    eprintln!("dspark: BPE of {vocab} tokens trained in {:.0} s", t0.elapsed().as_secs_f64());
    let encode = |docs: &[(String, String)]| -> Result<Vec<u32>> {
        let mut stream = Vec::new();
        for (_, text) in docs {
            // <bos> comes from the tokenizer's template, as it will for prompts.
            let enc = tk.encode(text.as_str(), true).map_err(|e| anyhow::anyhow!("encoding: {e}"))?;
            stream.extend_from_slice(enc.get_ids());
            stream.push(1); // <eos>
        }
        Ok(stream)
    };
    let (train_ids, val_ids) = (encode(&train_docs)?, encode(&val_docs)?);
    let bytes_per_token = va_bytes as f64 / val_ids.len().max(1) as f64;
    eprintln!(
        "dspark: {} train / {} validation tokens ({bytes_per_token:.2} bytes per token)",
        train_ids.len(),
        val_ids.len()
    );
    let cfg = small_config(vocab, a.hidden, a.layers, a.heads, a.window)?;
    let init = init_params(&cfg, a.seed)?;
    let n_params: usize = init.1.iter().map(|p| p.size().unwrap_or(0)).sum();
    eprintln!("dspark: target of {:.2}M parameters ({} layers, hidden {})", n_params as f64 / 1e6, a.layers, a.hidden);
    let bar = ProgressBar::new(a.steps);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise} < {eta_precise}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let bpb = |nats: f64| nats / std::f64::consts::LN_2 / bytes_per_token;
    let report = train_target(&cfg, init, &train_ids, &val_ids, &tc, |p| {
        bar.set_position(p.step);
        let val = p.val_loss.map_or(String::new(), |v| format!(" | val {:.3} bits/byte", bpb(v)));
        bar.set_message(format!("loss {:.3} | lr {:.2e} | {:.0} tok/s{val}", p.loss, p.lr, p.tokens_per_s));
    })?;
    bar.finish();
    let tr: Vec<&str> = train_docs.iter().map(|d| d.1.as_str()).collect();
    let va: Vec<&str> = val_docs.iter().map(|d| d.1.as_str()).collect();
    let baseline = byte_bigram_bits_per_byte(&tr, &va);
    eprintln!(
        "dspark: validation {:.3} → {:.3} bits per byte (byte-bigram baseline {baseline:.3}) in {:.1} min",
        bpb(report.initial_val_loss),
        bpb(report.final_val_loss),
        report.seconds / 60.0
    );

    // What the model writes: greedy continuations of three code prompts, from the weights as
    // shipped (bf16), so the report shows what users will see.
    let model = shipped_model(&cfg, &report)?;
    let mut samples = Vec::new();
    for prompt in SAMPLE_PROMPTS {
        let ids = tk.encode(prompt, true).map_err(|e| anyhow::anyhow!("encoding {prompt:?}: {e}"))?.get_ids().to_vec();
        let gen = gemma4::generate::GenerateConfig { max_tokens: 48, stop_tokens: vec![1], ..Default::default() };
        let out = gemma4::generate::generate(&model, &ids, &gen, |_| {})?;
        let text = tk.decode(&out.tokens, true).map_err(|e| anyhow::anyhow!("decoding: {e}"))?;
        eprintln!("dspark: greedy continuation of {prompt:?}:\n{prompt}{text}\n");
        samples.push(json!({"prompt": prompt, "continuation": text}));
    }
    let summary = json!({
        "corpus": root, "train_files": train_docs.len(), "validation_files": val_docs.len(),
        "train_tokens": train_ids.len(), "validation_tokens": val_ids.len(), "bytes_per_token": bytes_per_token,
        "vocab": vocab, "specials": SPECIALS, "parameters": n_params, "steps": a.steps, "batch": a.batch,
        "seq_len": a.seq_len, "lr": a.lr, "seed": a.seed, "minutes": report.seconds / 60.0,
        "validation_bits_per_byte": {"initial": bpb(report.initial_val_loss), "final": bpb(report.final_val_loss)},
        "byte_bigram_bits_per_byte": baseline,
        "greedy_continuations": samples,
        "loss_curve": report.losses.iter().step_by(10).collect::<Vec<_>>(),
    });
    let dir = write_target_checkpoint(&a.out, a.force, &cfg, &report, (&tk, train::bpe::CHAT_TEMPLATE), &summary)?;
    println!("{}", dir.display());
    Ok(())
}
