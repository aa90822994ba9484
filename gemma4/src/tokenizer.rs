//! A checkpoint's tokenizer: `tokenizer.json` (a Hugging Face `tokenizers` file) plus, when
//! present, `tokenizer_config.json`'s special tokens (`bos_token`, `eos_token`, `pad_token`) and
//! `chat_template`. [`stop_tokens`] picks the ids that end generation the way mlx-lm does: the
//! config's eos ids, and without any, the tokenizer's eos token.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::TextConfig;

/// Errors from loading or using a tokenizer. Each names the file it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// `tokenizer.json` exists but the `tokenizers` library could not parse it.
    #[error("{}: not a valid tokenizer file: {detail}", path.display())]
    Parse {
        /// The `tokenizer.json` file.
        path: PathBuf,
        /// The library's message.
        detail: String,
    },
    /// `tokenizer_config.json` is not JSON, or one of its fields has the wrong type.
    #[error("{}: {detail}", path.display())]
    Config {
        /// The `tokenizer_config.json` file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// Encoding text failed.
    #[error("{}: encoding {text:?}: {detail}", path.display())]
    Encode {
        /// The tokenizer file.
        path: PathBuf,
        /// The text being encoded.
        text: String,
        /// The library's message.
        detail: String,
    },
    /// Decoding token ids failed.
    #[error("{}: decoding {count} token ids: {detail}", path.display())]
    Decode {
        /// The tokenizer file.
        path: PathBuf,
        /// Number of token ids.
        count: usize,
        /// The library's message.
        detail: String,
    },
}

impl From<TokenizerError> for crate::Error {
    fn from(e: TokenizerError) -> crate::Error {
        match e {
            TokenizerError::Io { path, source } => crate::Error::Io { path, source },
            other => crate::Error::Input { op: "tokenizer", detail: other.to_string() },
        }
    }
}

/// A special token of `tokenizer_config.json`: its text and, if the vocabulary has it, its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialToken {
    /// The token's text, e.g. `<eos>`.
    pub content: String,
    /// Its id in the vocabulary; `None` when the vocabulary lacks it.
    pub id: Option<u32>,
}

/// A checkpoint's tokenizer (see the module docs).
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// `tokenizer.json`, for error messages.
    path: PathBuf,
    bos: Option<SpecialToken>,
    eos: Option<SpecialToken>,
    pad: Option<SpecialToken>,
    chat_template: Option<String>,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`, and `dir/tokenizer_config.json` if it exists.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        let path = dir.join("tokenizer.json");
        let text = match mlx_core::files::read_text(&path, mlx_core::files::LARGE_TEXT_LIMIT) {
            Ok(t) => t,
            Err(source) => return Err(TokenizerError::Io { path, source }),
        };
        let inner = text
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| TokenizerError::Parse { path: path.clone(), detail: e.to_string() })?;
        let mut tok = Tokenizer { inner, path, bos: None, eos: None, pad: None, chat_template: None };
        let config_path = dir.join("tokenizer_config.json");
        if config_path.exists() {
            tok.read_config(&config_path)?;
        }
        Ok(tok)
    }

    fn read_config(&mut self, path: &Path) -> Result<(), TokenizerError> {
        let text = mlx_core::files::read_text(path, mlx_core::files::JSON_LIMIT)
            .map_err(|source| TokenizerError::Io { path: path.to_path_buf(), source })?;
        let config_err = |detail: String| TokenizerError::Config { path: path.to_path_buf(), detail };
        let v: Value = serde_json::from_str(&text).map_err(|e| config_err(format!("invalid JSON: {e}")))?;
        if !v.is_object() {
            return Err(config_err("expected a JSON object".into()));
        }
        let special = |field: &str| -> Result<Option<SpecialToken>, TokenizerError> {
            let content = match v.get(field) {
                None | Some(Value::Null) => return Ok(None),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Object(o)) => match o.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    _ => return Err(config_err(format!("field {field:?}: expected a \"content\" string"))),
                },
                Some(other) => {
                    return Err(config_err(format!(
                        "field {field:?}: expected a string or {{\"content\": string}}, found {other}"
                    )))
                }
            };
            let id = self.inner.token_to_id(&content);
            Ok(Some(SpecialToken { content, id }))
        };
        let (bos, eos, pad) = (special("bos_token")?, special("eos_token")?, special("pad_token")?);
        let chat_template = match v.get("chat_template") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            // Some checkpoints list several named templates; kept as their JSON text.
            Some(other @ Value::Array(_)) => Some(other.to_string()),
            Some(other) => {
                return Err(config_err(format!("field \"chat_template\": expected a string, found {other}")))
            }
        };
        (self.bos, self.eos, self.pad, self.chat_template) = (bos, eos, pad, chat_template);
        Ok(())
    }

    /// Token ids of `text`; `add_special` adds the tokenizer's special tokens (BOS) as its
    /// post-processor says.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.inner.encode(text, add_special).map(|e| e.get_ids().to_vec()).map_err(|e| TokenizerError::Encode {
            path: self.path.clone(),
            text: text.to_string(),
            detail: e.to_string(),
        })
    }

    /// The text of `ids`, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner.decode(ids, true).map_err(|e| TokenizerError::Decode {
            path: self.path.clone(),
            count: ids.len(),
            detail: e.to_string(),
        })
    }

    /// The text of `ids`, special tokens left out except those in `kept` (markup such as
    /// Gemma-4's tool-call markers, which a chat parser must see), whose text is kept.
    pub fn decode_keeping(&self, ids: &[u32], kept: &[u32]) -> Result<String, TokenizerError> {
        if kept.is_empty() {
            return self.decode(ids);
        }
        let mut text = String::new();
        // Runs between kept tokens decode as usual. A special token never merges with its
        // neighbours, so this equals one decode with those tokens' text spliced in, for decoders
        // that treat each run alike (byte-level BPE, Gemma's; not one that strips a leading
        // space from the first token only).
        for run in ids.split_inclusive(|id| kept.contains(id)) {
            let (last, body) = match run.split_last() {
                Some((last, body)) if kept.contains(last) => (Some(*last), body),
                _ => (None, run),
            };
            text.push_str(&self.decode(body)?);
            if let Some(id) = last {
                text.push_str(&self.inner.id_to_token(id).unwrap_or_default());
            }
        }
        Ok(text)
    }

    /// The id of `token` in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The id of `tokenizer_config.json`'s `eos_token`, if it names one the vocabulary has.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos.as_ref().and_then(|t| t.id)
    }

    /// `tokenizer_config.json`'s `bos_token`.
    pub fn bos_token(&self) -> Option<&SpecialToken> {
        self.bos.as_ref()
    }

    /// `tokenizer_config.json`'s `eos_token`.
    pub fn eos_token(&self) -> Option<&SpecialToken> {
        self.eos.as_ref()
    }

    /// `tokenizer_config.json`'s `pad_token`.
    pub fn pad_token(&self) -> Option<&SpecialToken> {
        self.pad.as_ref()
    }

    /// `tokenizer_config.json`'s `chat_template` (not applied anywhere yet).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The `tokenizer.json` this was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The ids that end generation, as mlx-lm picks them: the config's eos ids (config.json, or
/// generation_config.json's, which replace them); without any, the tokenizer's eos token; with
/// neither, none (generation runs to its length limit).
pub fn stop_tokens(config: &TextConfig, tok: Option<&Tokenizer>) -> Vec<u32> {
    if !config.eos_token_ids.is_empty() {
        return config.eos_token_ids.clone();
    }
    tok.and_then(Tokenizer::eos_id).into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer.json over `<pad> <eos> <bos> hello world`.
    const TOKENIZER_JSON: &str = r#"{
      "version": "1.0",
      "truncation": null,
      "padding": null,
      "added_tokens": [
        {"id": 0, "content": "<pad>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        {"id": 1, "content": "<eos>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        {"id": 2, "content": "<bos>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
      ],
      "normalizer": null,
      "pre_tokenizer": {"type": "Whitespace"},
      "post_processor": null,
      "decoder": null,
      "model": {"type": "WordLevel", "vocab": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "hello": 3, "world": 4}, "unk_token": "<pad>"}
    }"#;

    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str, config: Option<&str>) -> Dir {
            let d = std::env::temp_dir().join(format!("gemma4-tokenizer-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("tokenizer.json"), TOKENIZER_JSON).unwrap();
            if let Some(c) = config {
                std::fs::write(d.join("tokenizer_config.json"), c).unwrap();
            }
            Dir(d)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn config(eos: &[u32]) -> TextConfig {
        let mut c = crate::config::tiny_config_a();
        c.eos_token_ids = eos.to_vec();
        c
    }

    #[test]
    fn encodes_decodes_and_reads_special_tokens() {
        let d = Dir::new(
            "roundtrip",
            Some(
                r#"{"bos_token": "<bos>", "eos_token": {"content": "<eos>"}, "pad_token": "<pad>", "chat_template": "{{ x }}"}"#,
            ),
        );
        let t = Tokenizer::from_dir(&d.0).unwrap();
        assert_eq!(t.encode("hello world", true).unwrap(), vec![3, 4]);
        assert_eq!(t.decode(&[3, 4]).unwrap(), "hello world");
        assert_eq!(t.eos_id(), Some(1));
        assert_eq!(t.bos_token(), Some(&SpecialToken { content: "<bos>".into(), id: Some(2) }));
        assert_eq!(t.pad_token().and_then(|p| p.id), Some(0));
        assert_eq!(t.chat_template(), Some("{{ x }}"));
    }

    #[test]
    fn without_a_tokenizer_config_there_is_no_eos() {
        let d = Dir::new("noconfig", None);
        let t = Tokenizer::from_dir(&d.0).unwrap();
        assert_eq!(t.eos_id(), None);
        assert_eq!(t.chat_template(), None);
    }

    #[test]
    fn an_eos_token_missing_from_the_vocabulary_has_no_id() {
        let d = Dir::new("unknown-eos", Some(r#"{"eos_token": "<end_of_turn>"}"#));
        let t = Tokenizer::from_dir(&d.0).unwrap();
        assert_eq!(t.eos_token().map(|e| e.content.as_str()), Some("<end_of_turn>"));
        assert_eq!(t.eos_id(), None);
    }

    #[test]
    fn stop_tokens_prefer_the_config_then_fall_back_to_the_tokenizer_eos() {
        let d = Dir::new("stop", Some(r#"{"eos_token": "<eos>"}"#));
        let t = Tokenizer::from_dir(&d.0).unwrap();
        assert_eq!(stop_tokens(&config(&[7, 9]), Some(&t)), vec![7, 9]);
        assert_eq!(stop_tokens(&config(&[]), Some(&t)), vec![1]);
        assert_eq!(stop_tokens(&config(&[]), None), Vec::<u32>::new());
        assert_eq!(stop_tokens(&config(&[7]), None), vec![7]);
    }

    #[test]
    fn errors_name_the_file() {
        let d = Dir::new("errors", Some("{not json"));
        let e = Tokenizer::from_dir(&d.0).unwrap_err().to_string();
        assert!(e.contains("tokenizer_config.json") && e.contains("invalid JSON"), "{e}");

        std::fs::write(d.0.join("tokenizer_config.json"), r#"{"eos_token": 5}"#).unwrap();
        let e = Tokenizer::from_dir(&d.0).unwrap_err().to_string();
        assert!(e.contains("tokenizer_config.json") && e.contains("\"eos_token\""), "{e}");

        std::fs::write(d.0.join("tokenizer.json"), "{}").unwrap();
        let e = Tokenizer::from_dir(&d.0).unwrap_err();
        assert!(matches!(e, TokenizerError::Parse { .. }), "{e}");
        assert!(e.to_string().contains("tokenizer.json"), "{e}");

        std::fs::remove_file(d.0.join("tokenizer.json")).unwrap();
        let e = Tokenizer::from_dir(&d.0).unwrap_err();
        assert!(matches!(e, TokenizerError::Io { .. }) && e.to_string().contains("tokenizer.json"), "{e}");
        let e: crate::Error = e.into();
        assert!(e.to_string().contains("tokenizer.json"), "{e}");
    }
}
