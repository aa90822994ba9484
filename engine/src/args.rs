//! Command-line argument groups both front ends flatten into their commands (`dspark generate`,
//! `profile`, `calibrate`, `doctor`; `dspark-serve`), so a flag means the same everywhere and
//! is declared once. Behind the `clap` feature.

use std::path::PathBuf;

use gemma4::ComputeDtype;
use mlx_core::Device;

/// `--model`: the target checkpoint, the embedded default when absent.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TargetArg {
    /// Target checkpoint directory (config.json, model*.safetensors, tokenizer.json; HF or
    /// MLX-community naming, bf16 or MLX-quantized). Default: the embedded default model (a
    /// small Gemma-4 trained on the Python standard library).
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
}

/// `--drafter`: what drafts for the target, chosen with [`crate::selection::drafter_choice`].
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DrafterArg {
    /// Speculative decoding with this drafter: a DSpark (dspark.json) or DeepSpec
    /// (Gemma4DSparkModel) checkpoint directory, `default` for the embedded default drafter,
    /// `self` (the target drafting for itself; a test drafter) or `none` for plain decoding.
    /// Absent: the default drafter with the default model, plain decoding with --model.
    #[arg(long, value_name = "DIR|default|self|none")]
    pub drafter: Option<String>,
}

/// `--device` and `--dtype`: where and in what precision the target computes.
#[derive(clap::Args, Clone, Debug)]
pub struct ComputeArgs {
    /// cpu or gpu (Metal on Apple Silicon, CUDA with the mlx-cuda wheels).
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Compute dtype: auto (f32 on the CPU when the weights fit in half the free memory,
    /// quantized weights dequantized, a quantized drafter's too; as stored on a GPU), stored,
    /// f32, bf16 or f16. Files on disk are not changed.
    #[arg(long, default_value = "auto")]
    pub dtype: ComputeDtype,
}

impl Default for ComputeArgs {
    fn default() -> Self {
        ComputeArgs { device: Device::Cpu, dtype: ComputeDtype::Auto }
    }
}

/// `--model DIR` where a command needs a target checkpoint (no embedded default).
#[derive(clap::Args, Clone, Debug)]
pub struct ModelDirArg {
    /// Target checkpoint directory (config.json, model*.safetensors and, for text, tokenizer.json;
    /// HF or MLX-community naming).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
}

/// A flag value parser for a count in `min..=max` (`usize::MAX`: no upper bound); `what` names
/// the unit in the refusal ("prompts", "timed repetitions"). Negative numbers reach it (the
/// commands allow them at parse time) so the refusal states the range.
pub fn count(min: usize, max: usize, what: &'static str) -> impl Fn(&str) -> Result<usize, String> + Clone {
    move |s: &str| {
        let range = if max == usize::MAX { format!("at least {min} {what}") } else { format!("{min} to {max} {what}") };
        match s.trim().parse::<usize>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(format!("expected {range}")),
        }
    }
}

/// A flag value parser for a finite number greater than 0 (learning rates, scales).
pub fn positive(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err("expected a finite number greater than 0".into()),
    }
}

/// A sampling temperature as a flag value: 0 (greedy) or a T whose 1/T is a normal f32
/// ([`gemma4::sampling::check_temperature`]), refused by the parser with the range.
pub fn temperature(s: &str) -> Result<f64, String> {
    let t: f64 = s.trim().parse().map_err(|_| format!("{s:?} is not a number"))?;
    gemma4::sampling::check_temperature(t)?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        target: TargetArg,
        #[command(flatten)]
        drafter: DrafterArg,
        #[command(flatten)]
        compute: ComputeArgs,
        #[arg(long, value_parser = temperature, default_value_t = 0.0, allow_negative_numbers = true)]
        temperature: f64,
    }

    #[test]
    fn the_groups_parse_as_one_command_line() {
        let c = Cli::try_parse_from(["x"]).unwrap();
        assert!(c.target.model.is_none() && c.drafter.drafter.is_none());
        assert_eq!((c.compute.device, c.compute.dtype), (Device::Cpu, ComputeDtype::Auto));
        let c =
            Cli::try_parse_from(["x", "--model", "m", "--drafter", "none", "--dtype", "bf16", "--temperature", "0.7"])
                .unwrap();
        assert_eq!(c.target.model, Some(PathBuf::from("m")));
        assert_eq!(c.drafter.drafter.as_deref(), Some("none"));
        assert_eq!(c.compute.dtype, ComputeDtype::Bf16);
        assert_eq!(c.temperature, 0.7);
        let count2 = count(2, 64, "tokens");
        assert_eq!(count2("8"), Ok(8));
        for bad in ["1", "65", "-3", "x", "18446744073709551616"] {
            assert_eq!(count2(bad), Err("expected 2 to 64 tokens".to_string()), "{bad}");
        }
        assert_eq!(count(1, usize::MAX, "steps")("0"), Err("expected at least 1 steps".to_string()));
        assert_eq!(positive("3e-3"), Ok(3e-3));
        for bad in ["0", "-1", "nan", "inf"] {
            assert!(positive(bad).is_err(), "{bad}");
        }
        for bad in ["1e308", "1e-45", "-1", "hot"] {
            let e = Cli::try_parse_from(["x", "--temperature", bad]).err().expect(bad).to_string();
            assert!(e.contains("--temperature"), "{e}");
        }
    }
}
