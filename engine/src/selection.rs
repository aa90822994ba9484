//! Which target and drafter a front end runs, from its `--model`, `--drafter` and `--device`:
//! the rules `dspark generate`, `dspark profile` and `dspark-serve` share, checked before
//! anything loads.

use std::path::{Path, PathBuf};

use crate::default_model;
use crate::error::{Error, Result};

/// The drafter to decode with: the default model comes with its own drafter (`default`), any
/// other model decodes plainly unless `--drafter` is given, and `none` always decodes plainly.
pub fn drafter_choice<'a>(model: Option<&Path>, drafter: Option<&'a str>) -> Option<&'a str> {
    match (model, drafter) {
        (_, Some("none")) => None,
        (None, None) => Some("default"),
        (_, d) => d,
    }
}

/// The directory of a drafter choice: the embedded default drafter (written if missing) for
/// `default`, else the path given.
pub fn drafter_dir(choice: &str) -> Result<PathBuf> {
    match choice {
        "default" => default_model::ensure_drafter(false),
        d => Ok(PathBuf::from(d)),
    }
}

/// Refuses a drafter checkpoint (DSpark `dspark.json`, or a DeepSpec `config.json`) given where
/// a target model is expected. `flag` is the option that named it.
pub fn refuse_drafter_as_model(dir: &Path, flag: &'static str) -> Result<()> {
    match spec_decode::detect(dir) {
        Ok(kind) => Err(Error::DrafterAsModel { flag, dir: dir.to_path_buf(), kind }),
        Err(_) => Ok(()),
    }
}

/// The checks before loading: the device exists, `--model` is not a drafter, `--drafter
/// default` goes with the default model only; then selects the device and returns the model
/// directory (the embedded default, written if missing, when `model` is None).
pub fn select_target(model: Option<&Path>, drafter: Option<&str>, device: mlx_core::Device) -> Result<PathBuf> {
    if !device.is_available() {
        return Err(Error::NoBackend { device });
    }
    if let Some(m) = model {
        refuse_drafter_as_model(m, "--model")?;
        if drafter == Some("default") {
            return Err(Error::DefaultDrafterForModel { model: m.to_path_buf() });
        }
    }
    device.set_default()?;
    match model {
        Some(d) => Ok(d.to_path_buf()),
        None => default_model::ensure(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_model_brings_its_drafter_and_none_turns_it_off() {
        let m = Path::new("/some/model");
        assert_eq!(drafter_choice(None, None), Some("default"));
        assert_eq!(drafter_choice(None, Some("none")), None);
        assert_eq!(drafter_choice(Some(m), None), None);
        assert_eq!(drafter_choice(Some(m), Some("/d")), Some("/d"));
        assert_eq!(drafter_choice(Some(m), Some("none")), None);
        assert_eq!(drafter_choice(None, Some("self")), Some("self"));
    }

    #[test]
    fn a_drafter_directory_other_than_default_is_the_path_given() {
        assert_eq!(drafter_dir("/d/x").unwrap(), PathBuf::from("/d/x"));
    }
}
