//! The calibration sidecar of DeepSpec checkpoints ([`SIDECAR_FILE`]), and the check every
//! calibration block passes wherever it is read from (a DSpark `config.sts` or the sidecar).

use std::path::Path;

use crate::drafters::dspark::Calibration;
use crate::error::{Error, Result};

/// Where a drafter format without a descriptor of its own (DeepSpec: its `config.json` is
/// another project's format) keeps its calibration: this file in the checkpoint directory,
/// holding the same block DSpark stores as `config.sts`.
pub const SIDECAR_FILE: &str = "dspark-calibration.json";

/// Reads the sidecar calibration of `dir`, if there is one, checked against a block of `gamma`.
pub fn read_sidecar(dir: &Path, gamma: usize) -> Result<Option<Calibration>> {
    let path = dir.join(SIDECAR_FILE);
    let text = match mlx_core::files::read_text(&path, mlx_core::files::JSON_LIMIT) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::Io { path, source }),
    };
    let c: Calibration =
        serde_json::from_str(&text).map_err(|e| Error::checkpoint(&path, format!("invalid calibration: {e}")))?;
    check(&c, gamma).map_err(|detail| Error::checkpoint(&path, detail))?;
    Ok(Some(c))
}

/// Checks a calibration block against a block of `gamma` drafts: its version, γ thresholds and,
/// per fitted mode, γ positive temperatures. The message names the offending key.
pub fn check(c: &Calibration, gamma: usize) -> std::result::Result<(), String> {
    if !(1..=crate::drafters::dspark::CALIBRATION_VERSION).contains(&c.version) {
        return Err(format!(
            "sts.version {} is not supported (this build reads 1 to {})",
            c.version,
            crate::drafters::dspark::CALIBRATION_VERSION
        ));
    }
    if c.thresholds.len() != gamma {
        return Err(format!("sts.thresholds has {} entries, expected gamma = {gamma}", c.thresholds.len()));
    }
    for (name, fit) in [("greedy", &c.greedy), ("sampled", &c.sampled)] {
        let Some(fit) = fit else { continue };
        if fit.temperatures.len() != gamma {
            return Err(format!(
                "sts.{name}.temperatures has {} entries, expected gamma = {gamma}",
                fit.temperatures.len()
            ));
        }
        if let Some(t) = fit.temperatures.iter().find(|t| !(t.is_finite() && **t > 0.0)) {
            return Err(format!("sts.{name}.temperatures holds {t}: expected positive temperatures"));
        }
        if !fit.shifts.is_empty() && fit.shifts.len() != gamma {
            return Err(format!("sts.{name}.shifts has {} entries, expected gamma = {gamma}", fit.shifts.len()));
        }
        if let Some(b) = fit.shifts.iter().find(|b| !b.is_finite()) {
            return Err(format!("sts.{name}.shifts holds {b}: expected finite shifts"));
        }
        if !fit.survival_maps.is_empty() && fit.survival_maps.len() != gamma {
            return Err(format!(
                "sts.{name}.survivalMaps has {} entries, expected gamma = {gamma}",
                fit.survival_maps.len()
            ));
        }
        for (k, m) in fit.sts().maps.iter().enumerate() {
            m.check().map_err(|e| format!("sts.{name}.survivalMaps[{k}]: {e}"))?;
        }
    }
    Ok(())
}

/// Writes `c` as the sidecar of `dir`, atomically (`mlx_core::files::write_atomic`).
pub fn write_sidecar(dir: &Path, c: &Calibration) -> Result<()> {
    let path = dir.join(SIDECAR_FILE);
    let body = serde_json::to_string_pretty(c).map_err(|e| Error::Contract(e.to_string()))? + "\n";
    mlx_core::files::write_atomic(&path, body.as_bytes()).map_err(|source| Error::Io { path, source })
}
