//! Conversations to prompt ids, the one rule for the server's `/v1/chat/completions` and
//! `dspark generate --chat`: with a chat template (`tokenizer_config.json`'s `chat_template`),
//! the messages are rendered with it, generation prompt appended, and the text encoded without
//! added special tokens (the template writes them, as Hugging Face's `apply_chat_template`
//! does). A tokenizer without a template gets the messages' contents joined by newlines,
//! encoded like a plain prompt (with the tokenizer's special tokens), as mlx-lm's server falls
//! back to a plain rendering.

use gemma4::chat_template::{ChatInput, ChatTemplate, ChatTemplateError};
use gemma4::tokenizer::{Tokenizer, TokenizerError};
use serde_json::Value;

/// Why a conversation could not become ids.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The chat template could not render the messages (a malformed message, or the
    /// template itself raised an error); the server answers 400 on `messages`.
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    /// The rendered (or joined) text could not be encoded into token ids.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

/// The ids of a plain text prompt.
pub fn text_ids(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, TokenizerError> {
    tok.encode(text, true)
}

/// The ids of `messages` (a JSON list of `{"role", "content"}` with string contents).
pub fn chat_ids(tok: &Tokenizer, template: Option<&ChatTemplate>, messages: &Value) -> Result<Vec<u32>, ChatError> {
    match template {
        Some(t) => Ok(tok.encode(&t.render_messages(messages, true)?, false)?),
        None => {
            let parts: Vec<&str> = messages
                .as_array()
                .map(|m| m.iter().filter_map(|m| m.get("content").and_then(Value::as_str)).collect())
                .unwrap_or_default();
            Ok(text_ids(tok, &parts.join("\n"))?)
        }
    }
}

/// The ids of a conversation rendered with tools and template variables (`input`), followed
/// by `reply_prefix`: text the reply is made to start with (a tool call a request forces),
/// which the model then continues.
pub fn chat_input_ids(
    tok: &Tokenizer,
    template: &ChatTemplate,
    input: &ChatInput<'_>,
    reply_prefix: &str,
) -> Result<Vec<u32>, ChatError> {
    let mut text = template.render_chat(input)?;
    text.push_str(reply_prefix);
    Ok(tok.encode(&text, false)?)
}

/// A one-message user conversation.
pub fn user_message(text: &str) -> Value {
    serde_json::json!([{"role": "user", "content": text}])
}
