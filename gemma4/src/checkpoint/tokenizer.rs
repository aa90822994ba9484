//! Tokenizer files of written checkpoints: a generated word-level one, or copies of the source's.

use std::path::Path;

use serde_json::{json, Value};

use super::shards::write_json;
use crate::error::{Error, Result};

/// A word-level `tokenizer.json` (+ `tokenizer_config.json`): `<pad>` 0, `<eos>` 1, `<bos>` 2,
/// `<unk>` 3, then words `t4 … t{vocab-1}`, whitespace pre-tokenizer.
pub fn write_word_level_tokenizer(dir: &Path, vocab_size: usize) -> Result<()> {
    let special = ["<pad>", "<eos>", "<bos>", "<unk>"];
    let word = |i: usize| if i < special.len() { special[i].to_string() } else { format!("t{i}") };
    let vocab: serde_json::Map<String, Value> = (0..vocab_size).map(|i| (word(i), json!(i))).collect();
    let added: Vec<Value> = special
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let tok = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": Value::Object(vocab), "unk_token": "<unk>"}
    });
    write_json(&dir.join("tokenizer.json"), &tok)?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
                "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 4096}),
    )
}

pub(crate) fn copy_tokenizer(src: &Path, dst: &Path) -> Result<()> {
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json"] {
        let from = src.join(f);
        if from.is_file() {
            std::fs::copy(&from, dst.join(f)).map_err(|source| Error::Io { path: from.clone(), source })?;
        }
    }
    Ok(())
}
