//! A byte-level BPE tokenizer trained with Hugging Face's `tokenizers` on the corpus's training
//! split, written as `tokenizer.json` + `tokenizer_config.json` in Hugging Face's format so the
//! model loads it with the same code as any checkpoint's tokenizer.

use std::path::Path;

use serde_json::json;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper};
use tokenizers::{Tokenizer, TokenizerBuilder};

use crate::error::{Error, Result};

/// The special tokens, in id order: 0 pad, 1 eos, 2 bos (Gemma's ids for them).
pub const SPECIALS: [&str; 3] = ["<pad>", "<eos>", "<bos>"];

fn tok_err(what: &str) -> impl Fn(tokenizers::Error) -> Error + '_ {
    move |e| Error::Invalid { what: what.to_string(), detail: e.to_string() }
}

/// Trains a byte-level BPE of `vocab_size` tokens (specials included) on `texts`.
pub fn train_bpe<'a>(texts: impl Iterator<Item = &'a str> + Send, vocab_size: usize) -> Result<Tokenizer> {
    train_bpe_with(texts, vocab_size, &[])
}

/// [`train_bpe`] with `markers` as further special tokens (ids 3.., in order): markup a chat
/// format writes, each encoded as one token and never merged with text.
pub fn train_bpe_with<'a>(
    texts: impl Iterator<Item = &'a str> + Send,
    vocab_size: usize,
    markers: &[&str],
) -> Result<Tokenizer> {
    let reserved = 256 + SPECIALS.len() + markers.len();
    if vocab_size < reserved {
        return Err(Error::Invalid {
            what: "vocab_size".into(),
            detail: format!("{vocab_size}: a byte-level BPE needs at least {reserved} tokens"),
        });
    }
    let specials: Vec<AddedToken> =
        SPECIALS.iter().chain(markers).map(|s| AddedToken::from(s.to_string(), true)).collect();
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tk =
        TokenizerBuilder::<BPE, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>::new()
            .with_model(BPE::default())
            .with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true))))
            .with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevelDecoder::default())))
            .build()
            .map_err(tok_err("building the tokenizer"))?;
    tk.train(&mut trainer, texts).map_err(tok_err("training the tokenizer"))?;
    // Encoding with special tokens puts <bos> first, as Gemma's tokenizer.json does.
    let bos = TemplateProcessing::builder()
        .try_single(format!("{} $A", SPECIALS[2]))
        .and_then(|b| b.try_pair(format!("{} $A {} $B", SPECIALS[2], SPECIALS[2])))
        .map_err(|e| Error::Invalid { what: "the tokenizer's template".into(), detail: e.to_string() })?
        .special_tokens(vec![(SPECIALS[2], 2)])
        .build()
        .map_err(|e| Error::Invalid { what: "the tokenizer's template".into(), detail: e.to_string() })?;
    tk.with_post_processor(Some(PostProcessorWrapper::Template(bos)));
    Ok(Tokenizer::from(tk))
}

/// The chat template of a code model trained here: each message becomes a Python comment line
/// (`# role: content`) and the reply starts after `# assistant:`, so chat requests continue
/// code the way the model was trained to.
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}# {{ message['role'] }}: \
{{ message['content'] | trim }}\n{% endfor %}{% if add_generation_prompt %}# assistant:\n{% endif %}";

/// Writes `tokenizer.json` and a `tokenizer_config.json` naming bos, eos, pad and the chat
/// template (a code model's is [`CHAT_TEMPLATE`]) into `dir`.
pub fn write_tokenizer(tk: &Tokenizer, dir: &Path, template: &str) -> Result<()> {
    let path = dir.join("tokenizer.json");
    tk.save(&path, false).map_err(tok_err("writing tokenizer.json"))?;
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIALS[2], "eos_token": SPECIALS[1], "pad_token": SPECIALS[0],
        "add_bos_token": true, "add_eos_token": false,
        "model_max_length": 4096,
        "chat_template": template,
    });
    let cpath = dir.join("tokenizer_config.json");
    std::fs::write(&cpath, serde_json::to_string_pretty(&config).unwrap_or_default())
        .map_err(|source| Error::Io { path: cpath, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trains_a_byte_level_bpe_that_round_trips() {
        let text =
            "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n";
        let docs: Vec<String> = (0..50).map(|i| format!("{text}# variant {i}\nx_{i} = fibonacci({i})\n")).collect();
        let tk = train_bpe(docs.iter().map(String::as_str), 400).unwrap();
        assert!(tk.get_vocab_size(true) <= 400 && tk.get_vocab_size(true) > 300, "{}", tk.get_vocab_size(true));
        for (i, s) in SPECIALS.iter().enumerate() {
            assert_eq!(tk.token_to_id(s), Some(i as u32), "{s}");
        }
        let with_bos = tk.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!(with_bos[0], 2, "encoding with special tokens starts with <bos>");
        let ids = tk.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(&with_bos[1..], &ids[..]);
        assert!(ids.len() < text.len() / 2, "merges compress code: {} ids for {} bytes", ids.len(), text.len());
        assert_eq!(tk.decode(&ids, true).unwrap(), text, "byte-level BPE round-trips");
        // Unseen bytes still encode (byte fallback through the initial alphabet).
        let odd = "λ → ∞";
        let ids = tk.encode(odd, false).unwrap().get_ids().to_vec();
        assert_eq!(tk.decode(&ids, true).unwrap(), odd);
        assert!(train_bpe(docs.iter().map(String::as_str), 100).unwrap_err().to_string().contains("at least 259"));
    }

    #[test]
    fn the_written_tokenizer_loads_with_its_chat_template() {
        let docs: Vec<String> = (0..40).map(|i| format!("def f{i}(x):\n    return x + {i}\n")).collect();
        let tk = train_bpe(docs.iter().map(String::as_str), 300).unwrap();
        let dir = std::env::temp_dir().join(format!("dspark-bpe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_tokenizer(&tk, &dir, CHAT_TEMPLATE).unwrap();
        let loaded = gemma4::tokenizer::Tokenizer::from_dir(&dir).unwrap();
        let t = gemma4::chat_template::ChatTemplate::of(&loaded).unwrap().expect("a chat template");
        assert_eq!(t.render("  sort a list ").unwrap(), "<bos># user: sort a list\n# assistant:\n");
        assert_eq!(loaded.encode("def f(x):", true).unwrap()[0], 2, "<bos> first");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
