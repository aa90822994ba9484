//! Config errors: every variant names the field, [`ConfigError::InFile`] adds the file.

use std::fmt::Display;
use std::path::{Path, PathBuf};

/// Why a config was refused. Every variant names the field (dotted path, e.g.
/// `text_config.layer_types[3]`); [`ConfigError::InFile`] adds the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// Malformed JSON; serde_json's message carries the line and column.
    #[error("invalid JSON: {source}")]
    Json {
        /// The parse error.
        source: serde_json::Error,
    },
    /// A field holds a JSON value of the wrong type.
    #[error("{field}: {source}")]
    Type {
        /// Dotted path of the field.
        field: String,
        /// serde_json's type error.
        source: serde_json::Error,
    },
    /// A field's value is out of range or inconsistent with other fields.
    #[error("{field}: expected {expected}, got {got}")]
    Invalid {
        /// Dotted path of the field.
        field: String,
        /// What would be accepted.
        expected: String,
        /// The value found.
        got: String,
    },
    /// A quantization block names a mode other than `"affine"`.
    #[error("{field}: quantization mode \"{mode}\" is not supported (only \"affine\" is)")]
    UnsupportedQuantMode {
        /// Dotted path of the `mode` field.
        field: String,
        /// The mode found.
        mode: String,
    },
    /// Wraps another config error with the file it came from.
    #[error("{}: {source}", path.display())]
    InFile {
        /// The config file.
        path: PathBuf,
        /// The error inside it.
        source: Box<ConfigError>,
    },
}

impl ConfigError {
    /// Sets the field of an `Invalid` error built without one.
    pub(crate) fn in_field(self, field: &str) -> Self {
        match self {
            ConfigError::Invalid { expected, got, .. } => ConfigError::Invalid { field: field.into(), expected, got },
            other => other,
        }
    }

    pub(crate) fn in_file(self, path: &Path) -> Self {
        ConfigError::InFile { path: path.to_path_buf(), source: Box::new(self) }
    }
}

pub(crate) fn invalid(field: impl Into<String>, want: impl Into<String>, got: impl Display) -> ConfigError {
    let (field, expected, got) = (field.into(), want.into(), got.to_string());
    ConfigError::Invalid { field, expected, got }
}
