//! How the front ends choose the verify window: `--schedule auto|full|throughput`, with
//! `--min-conf` and `--calibrated` as manual overrides (`dspark generate`). The throughput
//! schedule needs the drafter's STS temperatures for the request's mode (from `dspark
//! calibrate`) and the model's verify-cost profile for this device and dtype (from `dspark
//! profile`). `dspark generate` chooses for its one request; the engine chooses once per mode
//! (greedy, sampled) for the requests that ask for no pruning of their own.

use std::path::Path;

use gemma4::Model;
use spec_decode::profile::{load, profile_key};
use spec_decode::{Drafter, Pruning, ThroughputPlan};

use crate::error::{Error, Result};

/// `--schedule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Schedule {
    /// The throughput schedule when the drafter is calibrated for this mode and the model has
    /// a profile for this device and dtype; full blocks otherwise.
    Auto,
    /// Verify every draft of the block (or what --min-conf / --calibrated keep).
    Full,
    /// Algorithm 1 with its early stop: admit drafts while each one's calibrated survival pays
    /// for its marginal round cost at the tokens per step the request has achieved so far (the
    /// round's own expected throughput for the first two rounds).
    Throughput,
}

/// The pruning rule for requests of one mode (`greedy` or sampled), and a line saying what was
/// chosen and why.
pub fn choose(
    schedule: Schedule,
    manual: Option<Pruning>,
    drafter: &dyn Drafter,
    model: &Model,
    model_dir: &Path,
    device: mlx_core::Device,
    greedy: bool,
) -> Result<(Pruning, String)> {
    if let Some(p) = manual {
        if schedule == Schedule::Throughput {
            return Err(Error::ThroughputWithManualPruning);
        }
        return Ok((p, "manual confidence pruning".into()));
    }
    if schedule == Schedule::Full {
        return Ok((Pruning::Off, "full blocks".into()));
    }
    let mode = if greedy { "greedy" } else { "sampled" };
    let key = profile_key(device, model);
    let temperatures = drafter.sts(greedy);
    let profile = load(model_dir, &key)?;
    match (temperatures, profile) {
        (Some(t), Some(p)) => {
            let cost = p.round_cost(greedy, true);
            let line = format!(
                "throughput schedule ({mode} STS; round cost from profile {key}: {:.2} steps verifying 1 draft, {:.2} verifying {})",
                cost.get(1).copied().unwrap_or(f32::NAN),
                cost.last().copied().unwrap_or(f32::NAN),
                cost.len() - 1
            );
            let line = match p.mismatch(drafter, model) {
                Some(why) => format!("{line}; warning: {why} (rerun `dspark profile` with this drafter)"),
                None => line,
            };
            Ok((Pruning::Throughput(ThroughputPlan::new(t, cost)), line))
        }
        (t, p) if schedule == Schedule::Throughput => {
            let mut missing = Vec::new();
            if t.is_none() {
                missing.push(format!(
                    "{} has no STS temperatures for {mode} decoding (run `dspark calibrate`)",
                    drafter.name()
                ));
            }
            if p.is_none() {
                missing.push(format!(
                    "{} has no verify-cost profile for {key} (run `dspark profile`)",
                    model_dir.display()
                ));
            }
            Err(Error::ThroughputUnavailable { missing })
        }
        (t, _) => Ok((
            Pruning::Off,
            format!(
                "full blocks (no {})",
                if t.is_none() { format!("{mode} calibration") } else { format!("profile for {key}") }
            ),
        )),
    }
}
