//! `cargo xtask train-default`: rebuilds the embedded default from nothing but the Python
//! standard library on this machine — the tokenizer and target (`dspark train-target`), the
//! drafter's training prompts (heads of, and windows inside, train-split files), the target's
//! own greedy and sampled (T = 1) continuations of them (`dspark regen`), and the DSpark drafter
//! trained on both (`dspark train`; greedy data alone leaves it blind to sampled contexts) —
//! then copies the shipped files into `engine/default/`. Every stage is seeded, so a seed gives
//! the same files on a machine with the same Python, thread count and BLAS. Stage times are
//! printed and recorded in `engine/default/recipe.json`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::json;
use train::corpus::{list_sources, read_split, stdlib_dir, Split};
use train::prompts::{cut_prompts, Cut, Prompt};

/// Every number that decides the default. Changing one changes the shipped files.
#[derive(Clone, Debug, Serialize)]
pub struct Recipe {
    pub seed: u64,
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub window: usize,
    pub seq_len: usize,
    pub batch: usize,
    pub target_steps: u64,
    pub target_warmup: u64,
    pub target_lr: f64,
    /// Drafter training prompts: heads of train-split files, and windows inside them.
    pub head_prompts: usize,
    pub inside_prompts: usize,
    pub prompt_bytes: (usize, usize),
    /// Continuation length of each training prompt.
    pub max_new: usize,
    /// Temperature of the second, sampled regen of the same prompts (the first is greedy).
    pub sampled_temperature: f64,
    /// Sequences per regen shard (shards are the unit of the train / validation / test split).
    pub seqs_per_shard: usize,
    pub gamma: usize,
    pub drafter_layers: usize,
    pub drafter_width: usize,
    pub drafter_steps: u64,
    pub drafter_batch: usize,
    pub drafter_lr: f64,
    /// Train only the paper's confidence head (no law features, no greedy head).
    pub paper_confidence: bool,
    /// Validation-split prompts the drafter's confidence is calibrated on: every file's head,
    /// then windows inside the files (greedy rounds cluster by prompt, so the calibration's
    /// error is only as small as the prompts are many).
    pub calibration_prompts: usize,
}

impl Recipe {
    /// The shipped default; `quick` shrinks every stage to a smoke test of the pipeline.
    pub fn new(seed: u64, quick: bool) -> Recipe {
        let r = Recipe {
            seed,
            vocab: 4096,
            hidden: 256,
            layers: 6,
            heads: 4,
            window: 128,
            seq_len: 256,
            batch: 8,
            target_steps: 520,
            target_warmup: 30,
            target_lr: 3e-3,
            head_prompts: 250,
            inside_prompts: 150,
            prompt_bytes: (40, 400),
            max_new: 128,
            sampled_temperature: 1.0,
            seqs_per_shard: 50,
            gamma: 6,
            drafter_layers: 2,
            drafter_width: 128,
            drafter_steps: 3000,
            drafter_batch: 16,
            drafter_lr: 3e-3,
            paper_confidence: false,
            calibration_prompts: 3000,
        };
        if quick {
            Recipe {
                vocab: 512,
                hidden: 64,
                layers: 2,
                seq_len: 64,
                batch: 2,
                target_steps: 4,
                target_warmup: 1,
                head_prompts: 8,
                inside_prompts: 8,
                max_new: 16,
                seqs_per_shard: 4,
                drafter_steps: 4,
                drafter_batch: 4,
                calibration_prompts: 4,
                ..r
            }
        } else {
            r
        }
    }
}

/// The evaluation prompts of the default: heads of test-split files (never trained on), 40 to
/// 400 bytes of whole lines, chosen by a fixed seed.
pub fn test_prompts(count: usize) -> Result<Vec<Prompt>> {
    Ok(train::prompts::stdlib_heads(Split::Test, count, 20261203)?)
}

/// [`test_prompts`] encoded (with `<bos>`) by the tokenizer of the checkpoint in `model_dir`.
pub fn test_prompt_ids(model_dir: &Path, count: usize) -> Result<(Vec<Prompt>, Vec<Vec<u32>>)> {
    let tok = gemma4::tokenizer::Tokenizer::from_dir(model_dir)?;
    let prompts = test_prompts(count)?;
    let ids = prompts.iter().map(|p| tok.encode(&p.text, true)).collect::<Result<_, _>>()?;
    Ok((prompts, ids))
}

fn write_prompts(path: &Path, prompts: &[Prompt]) -> Result<()> {
    let lines: Vec<String> = prompts.iter().map(|p| json!({"prompt": p.text}).to_string()).collect();
    std::fs::write(path, lines.join("\n") + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Runs one `dspark` stage, streaming its output, and returns how long it took.
fn stage(bin: &Path, name: &str, args: &[String]) -> Result<f64> {
    eprintln!("\ntrain-default: {name}: dspark {}", args.join(" "));
    let t = Instant::now();
    let status = Command::new(bin).args(args).status().with_context(|| format!("running {}", bin.display()))?;
    if !status.success() {
        bail!("train-default: {name} failed ({status})");
    }
    let secs = t.elapsed().as_secs_f64();
    eprintln!("train-default: {name} took {:.1} min", secs / 60.0);
    Ok(secs)
}

fn copy_files(from: &Path, to: &Path, names: &[&str]) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for n in names {
        std::fs::copy(from.join(n), to.join(n)).with_context(|| format!("copying {}", from.join(n).display()))?;
    }
    Ok(())
}

/// Runs every stage under `work` and installs the result in `dest` (`dest/model`,
/// `dest/drafter`, `dest/recipe.json`).
/// The stages, in order; `from` skips the ones before it (their outputs must be in `work`).
pub const STAGES: [&str; 4] = ["target", "regen", "drafter", "calibrate"];

pub fn run(workspace: &Path, work: &Path, dest: &Path, recipe: &Recipe, from: &str) -> Result<()> {
    let first = STAGES
        .iter()
        .position(|s| *s == from)
        .with_context(|| format!("--from {from:?}: expected one of {STAGES:?}"))?;
    let bin = crate::serve_gate::workspace_binary(workspace, "dspark", true)?;
    std::fs::create_dir_all(work)?;
    let r = recipe;
    let s = |v: &dyn ToString| v.to_string();
    let p = |p: &Path| p.display().to_string();
    let target = work.join("target");
    let mut times = serde_json::Map::new();
    let args: Vec<String> = vec![
        "train-target".into(),
        "--out".into(),
        p(&target),
        "--force".into(),
        "--vocab".into(),
        s(&r.vocab),
        "--hidden".into(),
        s(&r.hidden),
        "--layers".into(),
        s(&r.layers),
        "--heads".into(),
        s(&r.heads),
        "--window".into(),
        s(&r.window),
        "--seq-len".into(),
        s(&r.seq_len),
        "--batch".into(),
        s(&r.batch),
        "--steps".into(),
        s(&r.target_steps),
        "--warmup".into(),
        s(&r.target_warmup),
        "--lr".into(),
        s(&r.target_lr),
        "--eval-every".into(),
        s(&(r.target_steps / 4).max(1)),
        "--seed".into(),
        s(&r.seed),
    ];
    if first == 0 {
        times.insert("target_s".into(), json!(stage(&bin, "target", &args)?));
    } else if !target.join("config.json").is_file() {
        bail!("--from {from}: {} holds no trained target", target.display());
    }

    let files = list_sources(&stdlib_dir(None)?)?;
    let docs = read_split(&files, Split::Train);
    let (lo, hi) = r.prompt_bytes;
    let mut prompts = cut_prompts(&docs, Cut::Head, r.head_prompts, lo, hi, r.seed ^ 0x4ead);
    prompts.extend(cut_prompts(&docs, Cut::Inside, r.inside_prompts, lo, hi, r.seed ^ 0x1451de));
    let prompt_file = work.join("drafter-prompts.jsonl");
    write_prompts(&prompt_file, &prompts)?;
    eprintln!("train-default: {} drafter training prompts from train-split files", prompts.len());

    // The same prompts twice: greedy continuations, then sampled ones.
    let (regen, sampled) = (work.join("regen"), work.join("regen-t1"));
    let regen_args = |out: &Path, temperature: f64| -> Vec<String> {
        let mut a: Vec<String> = vec![
            "regen".into(),
            "--model".into(),
            p(&target),
            "--prompts".into(),
            p(&prompt_file),
            "--out".into(),
            p(out),
            "--force".into(),
            "--plain".into(),
            "--max-new".into(),
            s(&r.max_new),
            "--seqs-per-shard".into(),
            s(&r.seqs_per_shard),
        ];
        if temperature > 0.0 {
            a.extend(["--temperature".into(), s(&temperature), "--seed".into(), s(&r.seed)]);
        }
        a
    };
    if first <= 1 {
        times.insert("regen_s".into(), json!(stage(&bin, "regen", &regen_args(&regen, 0.0))?));
        let sampled_args = regen_args(&sampled, r.sampled_temperature);
        times.insert("regen_sampled_s".into(), json!(stage(&bin, "regen (sampled)", &sampled_args)?));
    }

    let drafter = work.join("drafter");
    let mut args: Vec<String> = vec![
        "train".into(),
        "--model".into(),
        p(&target),
        "--data".into(),
        format!("{},{}", p(&regen), p(&sampled)),
        "--out".into(),
        p(&drafter),
        "--force".into(),
        "--gamma".into(),
        s(&r.gamma),
        "--layers".into(),
        s(&r.drafter_layers),
        "--d-model".into(),
        s(&r.drafter_width),
        "--steps".into(),
        s(&r.drafter_steps),
        "--batch".into(),
        s(&r.drafter_batch),
        "--lr".into(),
        s(&r.drafter_lr),
        "--eval-every".into(),
        s(&(r.drafter_steps / 10).max(1)),
        "--seed".into(),
        s(&r.seed),
    ];
    if r.paper_confidence {
        args.push("--paper-confidence".into());
    }
    if first <= 2 {
        times.insert("drafter_s".into(), json!(stage(&bin, "drafter", &args)?));
    } else if !drafter.join("best").join("dspark.json").is_file() {
        bail!("--from {from}: {} holds no trained drafter", drafter.join("best").display());
    }

    // Calibration (STS for greedy and T = 1, pruning thresholds) on heads of, then windows
    // inside, validation-split files, written into the trained drafter.
    let cal_prompts = train::prompts::stdlib_prompts(Split::Validation, r.calibration_prompts, r.seed ^ 0xca1b)?;
    let cal_file = work.join("calibration-prompts.jsonl");
    write_prompts(&cal_file, &cal_prompts)?;
    let args: Vec<String> = vec![
        "calibrate".into(),
        "--model".into(),
        p(&target),
        "--drafter".into(),
        p(&drafter.join("best")),
        "--prompt-file".into(),
        p(&cal_file),
        "--prompts".into(),
        s(&r.calibration_prompts),
        "--tokens".into(),
        s(&r.max_new),
        "--plot".into(),
        p(&work.join("reliability.png")),
        "--force".into(),
    ];
    times.insert("calibrate_s".into(), json!(stage(&bin, "calibrate", &args)?));

    install(&target, &drafter.join("best"), dest)?;
    if work.join("reliability.png").is_file() {
        std::fs::copy(work.join("reliability.png"), dest.join("reliability.png"))?;
    }
    if !times.contains_key("target_s") {
        // An earlier run trained the target: its report says how long that took.
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(target.join("train_report.json"))?)?;
        times.insert("target_s".into(), json!(report["minutes"].as_f64().unwrap_or(0.0) * 60.0));
    }
    let recipe_path = dest.join("recipe.json");
    // Stages skipped by --from keep the times the installed recipe recorded for them.
    if let Ok(old) = std::fs::read_to_string(&recipe_path) {
        let old: serde_json::Value = serde_json::from_str(&old).unwrap_or_default();
        for (k, v) in old["seconds"].as_object().into_iter().flatten() {
            if k != "total_s" && !times.contains_key(k) {
                times.insert(k.clone(), v.clone());
            }
        }
    }
    let total: f64 = times.iter().filter(|(k, _)| *k != "total_s").filter_map(|(_, v)| v.as_f64()).sum();
    times.insert("total_s".into(), json!(total));
    let doc = json!({"recipe": r, "seconds": times, "cpu_threads": std::thread::available_parallelism().map_or(0, |n| n.get()),
                     "blas": mlx_core::blas::linked()});
    std::fs::write(&recipe_path, serde_json::to_string_pretty(&doc)? + "\n")?;
    eprintln!("\ntrain-default: done; the stages took {:.1} min; installed in {}", total / 60.0, dest.display());
    Ok(())
}

/// The files of the shipped default: the target checkpoint and the drafter checkpoint.
pub const MODEL_FILES: [&str; 6] = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "LICENSE-PSF.txt",
    "train_report.json",
];

/// Copies a trained target and drafter into `dest` (replacing what was there).
pub fn install(target: &Path, drafter: &Path, dest: &Path) -> Result<()> {
    let (m, d) = (dest.join("model"), dest.join("drafter"));
    for dir in [&m, &d] {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
    }
    copy_files(target, &m, &MODEL_FILES)?;
    let names: Vec<String> = std::fs::read_dir(drafter)
        .with_context(|| format!("reading {}", drafter.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    copy_files(drafter, &d, &refs)?;
    Ok(())
}

/// Where the shipped default lives in the workspace.
pub fn default_dest(workspace: &Path) -> PathBuf {
    workspace.join("engine").join("default")
}
