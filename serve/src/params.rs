//! Request bodies of `/v1/completions` and `/v1/chat/completions`: deserialized into
//! [`Fields`], then validated against the served model, so that every refusal names the field
//! at fault (OpenAI's `param`): a value of the wrong type by its path (`messages[0].content`),
//! a value out of range by the check that refused it. Unknown fields are ignored, as
//! OpenAI-compatible servers do; known fields this server cannot honour (`n` > 1, `logprobs`,
//! `echo`, penalties, …) are refused rather than silently dropped.

use engine::chat::text_ids;
use engine::{ModelInfo, Request};
use gemma4::generate::GenerateConfig;
use gemma4::sampling::SamplerConfig;
use serde::Deserialize;
use serde_json::Value;

use crate::api_error::ApiError;
use crate::chat_request::{chat_prompt, ChatFields, ReplyFormat};

/// Which endpoint a body was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`: a `prompt` (text or token ids), answered with text.
    Completions,
    /// `POST /v1/chat/completions`: `messages`, rendered by the chat template, answered with
    /// an assistant message.
    Chat,
}

/// A validated request.
#[derive(Clone, Debug)]
pub struct Parsed {
    /// What the engine decodes: prompt ids, sampler, `max_tokens`, seed and stop strings.
    pub request: Request,
    /// `stream`: answer as server-sent events (an SSE chunk for each round that released
    /// text, a last chunk with `finish_reason`, then `data: [DONE]`) rather than one JSON
    /// body.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage and no choices.
    pub include_usage: bool,
    /// How a chat reply is read (thinking and tool calls); plain text for completions.
    pub reply: ReplyFormat,
}

/// The fields of either endpoint's body that this server reads (null counts as absent).
#[derive(Debug, Default, Deserialize)]
#[serde(default, expecting = "a JSON object")]
pub struct Fields {
    /// `model`: must be the served model's id when given.
    pub model: Option<String>,
    /// `/v1/completions`.
    pub prompt: Option<Prompt>,
    /// `/v1/chat/completions`.
    pub messages: Option<Vec<ChatMessage>>,
    /// `n`: choices per request; only 1 is served.
    pub n: Option<i64>,
    /// `stream`: answer with SSE chunks (default false).
    pub stream: Option<bool>,
    /// `stream_options`: read only when streaming.
    pub stream_options: Option<StreamOptions>,
    /// `temperature`: sampling temperature (default 1; 0 is greedy).
    pub temperature: Option<f64>,
    /// `top_p`: nucleus sampling mass, in (0, 1] (default 1: off).
    pub top_p: Option<f64>,
    /// `min_p`: drop tokens below this fraction of the top token's probability, in [0, 1]
    /// (default 0: off).
    pub min_p: Option<f64>,
    /// `top_k`: sample among the k likeliest tokens (0 or -1, the default: off).
    pub top_k: Option<i64>,
    /// `seed`: the sampler's seed, for reproducible sampling (default: a fresh one).
    pub seed: Option<u64>,
    /// `logit_bias`: token id (as a string key) → bias in [-100, 100], added to the target's
    /// logits before temperature and the filters, in plain and speculative decoding alike; at
    /// most 300 entries.
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// `stop`: up to 16 non-empty stop strings, matched on the decoded text.
    pub stop: Option<Stop>,
    /// `max_tokens`: most tokens to generate (default 16 for completions, 256 for chat, each
    /// bounded by the context left after the prompt).
    pub max_tokens: Option<i64>,
    /// Chat's newer name for `max_tokens`; wins when both are given.
    pub max_completion_tokens: Option<i64>,
    // Refused unless absent or "off", whatever their type: their values are never used.
    /// `best_of`: refused unless 1 (one candidate per request).
    pub best_of: Option<Value>,
    /// `echo`: refused unless false (the prompt is not echoed).
    pub echo: Option<Value>,
    /// `logprobs`: refused unless false or 0 (no logprobs are returned).
    pub logprobs: Option<Value>,
    /// `top_logprobs`: refused unless 0 (no logprobs are returned).
    pub top_logprobs: Option<Value>,
    /// `presence_penalty`: refused unless 0 (a penalty would change the target's
    /// distribution, which lossless speculative decoding preserves).
    pub presence_penalty: Option<Value>,
    /// `frequency_penalty`: refused unless 0, as `presence_penalty`.
    pub frequency_penalty: Option<Value>,
    /// `suffix`: always refused (no insertion mode).
    pub suffix: Option<Value>,
    /// `tools`: function declarations the chat template shows the model
    /// ([`crate::chat_request`]).
    pub tools: Option<Value>,
    /// `tool_choice`: `none`, `auto` (the default with tools), `required`, or a named function.
    pub tool_choice: Option<Value>,
    /// `parallel_tool_calls`: true (the default) returns every call the reply makes; false at
    /// most its first.
    pub parallel_tool_calls: Option<bool>,
    /// `chat_template_kwargs`: extra variables for the chat template (`enable_thinking`).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// `response_format`: refused unless `{"type": "text"}` (no JSON mode or schemas).
    pub response_format: Option<Value>,
}

/// A completion prompt: text, token ids, or a batch (of which one prompt is served).
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of token ids")]
pub enum Prompt {
    /// A text prompt, encoded with the tokenizer's special tokens.
    Text(String),
    /// Token ids, each checked against the vocabulary.
    Ids(Vec<u64>),
    /// A list of prompts; only a list of exactly one is served.
    Batch(Vec<OnePrompt>),
}

/// One prompt of a batch.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of token ids")]
pub enum OnePrompt {
    /// A text prompt, as [`Prompt::Text`].
    Text(String),
    /// Token ids, as [`Prompt::Ids`].
    Ids(Vec<u64>),
}

/// A chat message as sent; its role and content are checked after deserialization so the
/// refusal can say what is allowed.
#[derive(Debug, Deserialize)]
#[serde(expecting = "an object with 'role' and 'content'")]
pub struct ChatMessage {
    /// `role`: `system`, `developer`, `user`, `assistant` or `tool`; required.
    pub role: Option<String>,
    /// `content`: required, except that an `assistant` message may leave it out.
    pub content: Option<Content>,
    /// `tool_calls` of an assistant message: `[{"id", "type": "function", "function":
    /// {"name", "arguments"}}]`, checked in [`crate::chat_request`].
    pub tool_calls: Option<Value>,
    /// `tool_call_id` of a `tool` message: the call it answers.
    pub tool_call_id: Option<String>,
    /// `name`: of a `tool` message, the function that answered (else looked up by
    /// `tool_call_id`); of others, the participant's name, passed to the template.
    pub name: Option<String>,
}

/// A message's content: text, or a list of parts (of which only text parts are served).
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of text parts")]
pub enum Content {
    /// A plain string.
    Text(String),
    /// Content parts, concatenated; each must be `{"type": "text", "text": …}`.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Deserialize)]
pub struct ContentPart {
    /// `type`: only `text` is served (no images or audio).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// `text`: the part's text, required for a `text` part.
    pub text: Option<String>,
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, expecting = "an object")]
pub struct StreamOptions {
    /// `include_usage`: end the stream with a chunk carrying `usage` and no choices.
    pub include_usage: Option<bool>,
}

/// `stop`: one string or several.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of strings")]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several stop strings; decoding ends at the first that appears.
    Many(Vec<String>),
}

/// Default completion budget of `/v1/completions` (OpenAI's) and of chat (bounded by the
/// context left).
const DEFAULT_MAX_TOKENS: usize = 16;
const DEFAULT_CHAT_MAX_TOKENS: usize = 256;
/// Stop strings one request may give.
const MAX_STOPS: usize = 16;
/// Entries one `logit_bias` may have (OpenAI's limit).
const MAX_LOGIT_BIAS_ENTRIES: usize = 300;

fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(Some(param), msg)
}

/// Refuses a field unless it is absent or has one of the values meaning "off".
fn only_off(value: &Option<Value>, name: &str, off: &[Value], what: &str) -> Result<(), ApiError> {
    match value {
        Some(v) if !off.contains(v) => Err(bad(name, format!("'{name}' is not supported by this server ({what})"))),
        _ => Ok(()),
    }
}

/// The body's fields; a value of the wrong type is refused naming its path.
pub fn fields(body: &[u8]) -> Result<Fields, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(None, format!("the request body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::invalid(None, "the request body must be a JSON object"));
    }
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        bad(&path, format!("'{path}': {}", json_words(&e.into_inner().to_string())))
    })
}

/// serde's messages name Rust types where a client knows JSON's.
fn json_words(msg: &str) -> String {
    [
        ("expected f64", "expected a number"),
        ("expected i64", "expected an integer"),
        ("expected u64", "expected a non-negative integer"),
        ("expected a sequence", "expected a list"),
    ]
    .iter()
    .fold(msg.to_string(), |m, (rust, json)| m.replace(rust, json))
}

/// Parses and validates a body for `endpoint` against the served model.
pub fn parse(endpoint: Endpoint, body: &[u8], info: &ModelInfo) -> Result<Parsed, ApiError> {
    validate(endpoint, fields(body)?, info)
}

/// Checks deserialized fields against the served model and builds the request.
pub fn validate(endpoint: Endpoint, f: Fields, info: &ModelInfo) -> Result<Parsed, ApiError> {
    if let Some(m) = f.model.as_ref().filter(|m| **m != info.id) {
        return Err(ApiError::not_found(
            Some("model"),
            Some("model_not_found"),
            format!("the model '{m}' does not exist; this server serves '{}'", info.id),
        ));
    }
    if let Some(n) = f.n.filter(|&n| n != 1) {
        return Err(bad("n", format!("'n' must be 1 (one choice per request), got {n}")));
    }
    only_off(&f.best_of, "best_of", &[Value::from(1)], "one candidate per request")?;
    only_off(&f.echo, "echo", &[Value::from(false)], "the prompt is not echoed")?;
    only_off(&f.logprobs, "logprobs", &[Value::from(false), Value::from(0)], "no logprobs are returned")?;
    only_off(&f.top_logprobs, "top_logprobs", &[Value::from(0)], "no logprobs are returned")?;
    let zero = [Value::from(0), Value::from(0.0)];
    let penalties = "penalties would change the target's distribution";
    only_off(&f.presence_penalty, "presence_penalty", &zero, penalties)?;
    only_off(&f.frequency_penalty, "frequency_penalty", &zero, penalties)?;
    only_off(&f.suffix, "suffix", &[], "no insertion mode")?;
    only_off(&f.response_format, "response_format", &[serde_json::json!({"type": "text"})], "text output only")?;

    let stream = f.stream.unwrap_or(false);
    let include_usage = f.stream_options.and_then(|o| o.include_usage).unwrap_or(false);

    let temperature = f.temperature.unwrap_or(1.0);
    if let Err(e) = gemma4::sampling::check_temperature(temperature) {
        return Err(bad("temperature", format!("'temperature': {e}")));
    }
    let top_p = f.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(bad("top_p", format!("'top_p' must be in (0, 1], got {top_p}")));
    }
    let min_p = f.min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(bad("min_p", format!("'min_p' must be in [0, 1], got {min_p}")));
    }
    let top_k = match f.top_k {
        None | Some(-1) | Some(0) => 0,
        // The vocabulary rule is the sampler's own (gemma4::sampling::check_top_k).
        Some(k) if usize::try_from(k).is_ok_and(|k| k > 0 && gemma4::sampling::check_top_k(k, info.vocab).is_ok()) => {
            k as usize
        }
        Some(k) => {
            return Err(bad(
                "top_k",
                format!("'top_k' must be 0 or -1 (off) or in 1..={} (below the vocabulary), got {k}", info.vocab - 1),
            ))
        }
    };
    let logit_bias = match f.logit_bias {
        None => Vec::new(),
        Some(map) => checked_logit_bias(&map, info)?,
    };
    let seeded = f.seed.is_some();
    let seed = f.seed.unwrap_or_else(fresh_seed);
    let stop = match f.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stop.len() > MAX_STOPS {
        return Err(bad("stop", format!("at most {MAX_STOPS} stop strings, got {}", stop.len())));
    }
    if stop.iter().any(String::is_empty) {
        return Err(bad("stop", "stop strings must not be empty"));
    }
    if !stop.is_empty() && info.tokenizer.is_none() {
        return Err(bad("stop", "this model has no tokenizer, so stop strings cannot be matched"));
    }

    let (mut kept_tokens, mut reply) = (Vec::new(), ReplyFormat::default());
    let (prompt, prompt_field) = match endpoint {
        Endpoint::Completions => (completion_prompt(f.prompt, info)?, "prompt"),
        Endpoint::Chat => {
            let fields = ChatFields {
                messages: f.messages,
                tools: f.tools,
                tool_choice: f.tool_choice,
                kwargs: f.chat_template_kwargs,
                parallel_tool_calls: f.parallel_tool_calls,
            };
            let chat = chat_prompt(fields, info)?;
            (kept_tokens, reply) = (chat.kept_tokens, chat.reply);
            (checked_ids(chat.ids.into_iter().map(u64::from), info, "messages")?, "messages")
        }
    };
    if prompt.is_empty() {
        return Err(bad(prompt_field, "the prompt encodes to no tokens"));
    }
    if prompt.len() >= info.context {
        return Err(ApiError::invalid_code(
            prompt_field,
            "context_length_exceeded",
            format!(
                "the prompt is {} tokens; the model's context is {} positions, and at least one must be left for the completion",
                prompt.len(),
                info.context
            ),
        ));
    }
    let room = info.context - prompt.len();
    let (max_field, max) = match (endpoint, f.max_completion_tokens) {
        (Endpoint::Chat, Some(n)) => ("max_completion_tokens", Some(n)),
        _ => ("max_tokens", f.max_tokens),
    };
    let max_tokens = match max {
        None if endpoint == Endpoint::Chat => DEFAULT_CHAT_MAX_TOKENS.min(room),
        None => DEFAULT_MAX_TOKENS.min(room),
        Some(n) if n < 1 => return Err(bad(max_field, format!("'{max_field}' must be at least 1, got {n}"))),
        Some(n) if n as u64 > room as u64 => {
            return Err(ApiError::invalid_code(
                max_field,
                "context_length_exceeded",
                format!(
                    "'{max_field}' is {n}, but the prompt ({} tokens) leaves {room} of the model's {} positions",
                    prompt.len(),
                    info.context
                ),
            ))
        }
        Some(n) => n as usize,
    };

    let sampler = SamplerConfig { temperature, top_p, top_k, min_p, min_tokens_to_keep: 1, logit_bias };
    let generate = GenerateConfig {
        max_tokens,
        sampler,
        seed,
        prefill_step: info.prefill_step(),
        stop_tokens: info.stop_tokens.clone(),
    };
    Ok(Parsed {
        request: Request {
            prompt,
            generate,
            stop,
            gamma: info.gamma,
            pruning: Default::default(),
            kept_tokens,
            seeded,
            adaptive: false,
        },
        reply,
        stream,
        include_usage,
    })
}

/// A seed for a sampled request that gave none (OpenAI: sampling is then not reproducible):
/// from the operating system's random source, else the clock and a counter.
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    getrandom::u64().unwrap_or_else(|_| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        t ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
    })
}

/// Ids as given, each checked against the vocabulary (ids past `u32` are outside it too).
fn checked_ids(ids: impl IntoIterator<Item = u64>, info: &ModelInfo, field: &str) -> Result<Vec<u32>, ApiError> {
    ids.into_iter()
        .map(|t| match u32::try_from(t) {
            Ok(id) if (id as usize) < info.vocab => Ok(id),
            _ => Err(bad(field, format!("'{field}': token id {t} is outside the vocabulary of {} tokens", info.vocab))),
        })
        .collect()
}

/// `logit_bias` as the sampler takes it: each key a token id below the vocabulary (given
/// once), each value a number in [-100, 100], at most [`MAX_LOGIT_BIAS_ENTRIES`] entries.
fn checked_logit_bias(map: &serde_json::Map<String, Value>, info: &ModelInfo) -> Result<Vec<(u32, f32)>, ApiError> {
    let field = "logit_bias";
    if map.len() > MAX_LOGIT_BIAS_ENTRIES {
        return Err(bad(field, format!("'{field}' takes at most {MAX_LOGIT_BIAS_ENTRIES} entries, got {}", map.len())));
    }
    let mut out: Vec<(u32, f32)> = Vec::with_capacity(map.len());
    for (key, value) in map {
        let id = key.parse::<u32>().map_err(|_| {
            bad(field, format!("'{field}': key {key:?} is not a token id (below the vocabulary of {})", info.vocab))
        })?;
        let bias = value.as_f64().ok_or_else(|| {
            bad(field, format!("'{field}': the bias of key {key:?} must be a number in [-100, 100], got {value}"))
        })?;
        out.push((id, bias as f32));
    }
    // Ranges, the vocabulary and repeats ("5" and "05" are one token): the sampler's own rule.
    gemma4::sampling::check_logit_bias(&out, Some(info.vocab)).map_err(|e| bad(field, format!("'{field}': {e}")))?;
    Ok(out)
}

fn completion_prompt(prompt: Option<Prompt>, info: &ModelInfo) -> Result<Vec<u32>, ApiError> {
    let encode = |text: &str| -> Result<Vec<u32>, ApiError> {
        let tok = info
            .tokenizer
            .as_ref()
            .ok_or_else(|| bad("prompt", "this model has no tokenizer; send the prompt as a list of token ids"))?;
        let ids = text_ids(tok, text).map_err(|e| bad("prompt", format!("the prompt cannot be encoded: {e}")))?;
        checked_ids(ids.into_iter().map(u64::from), info, "prompt")
    };
    match prompt {
        None => Err(bad("prompt", "'prompt' is required")),
        Some(Prompt::Text(s)) => encode(&s),
        Some(Prompt::Ids(ids)) => checked_ids(ids, info, "prompt"),
        Some(Prompt::Batch(mut batch)) if batch.len() == 1 => match batch.remove(0) {
            OnePrompt::Text(s) => encode(&s),
            OnePrompt::Ids(ids) => checked_ids(ids, info, "prompt"),
        },
        Some(Prompt::Batch(batch)) => {
            Err(bad("prompt", format!("one prompt per request (n = 1), got {}", batch.len())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The param and message a body's type error gets.
    fn refusal(body: &str) -> (Option<String>, String) {
        let e = fields(body.as_bytes()).expect_err(body);
        (e.param, e.message)
    }

    #[test]
    fn type_errors_name_the_path_and_say_what_json_was_expected() {
        for (body, param, message) in [
            (
                r#"{"temperature": "hot"}"#,
                "temperature",
                r#"'temperature': invalid type: string "hot", expected a number"#,
            ),
            (
                r#"{"max_tokens": 2.5}"#,
                "max_tokens",
                "'max_tokens': invalid type: floating point `2.5`, expected an integer",
            ),
            (r#"{"seed": -1}"#, "seed", "'seed': invalid value: integer `-1`, expected a non-negative integer"),
            (r#"{"stream": "yes"}"#, "stream", r#"'stream': invalid type: string "yes", expected a boolean"#),
            (r#"{"stop": 5}"#, "stop", "'stop': expected a string or a list of strings"),
            (r#"{"prompt": 5}"#, "prompt", "'prompt': expected a string or a list of token ids"),
            (r#"{"messages": "hi"}"#, "messages", r#"'messages': invalid type: string "hi", expected a list"#),
            (
                r#"{"messages": ["hi"]}"#,
                "messages[0]",
                r#"'messages[0]': invalid type: string "hi", expected an object with 'role' and 'content'"#,
            ),
            (
                r#"{"messages": [{"role": "user", "content": 5}]}"#,
                "messages[0].content",
                "'messages[0].content': expected a string or a list of text parts",
            ),
            (
                r#"{"stream_options": {"include_usage": 1}}"#,
                "stream_options.include_usage",
                "'stream_options.include_usage': invalid type: integer `1`, expected a boolean",
            ),
        ] {
            assert_eq!(refusal(body), (Some(param.to_string()), message.to_string()), "{body}");
        }
    }

    #[test]
    fn null_counts_as_absent_and_unknown_fields_are_ignored() {
        let f = fields(br#"{"temperature": null, "stop": null, "user": "x", "prompt": [1, 2]}"#).unwrap();
        assert!(f.temperature.is_none() && f.stop.is_none());
        assert!(matches!(f.prompt, Some(Prompt::Ids(ids)) if ids == [1, 2]));
        let (param, message) = refusal("[1, 2]");
        assert_eq!(param, None);
        assert!(message.contains("JSON object"), "{message}");
    }

    #[test]
    fn token_ids_past_the_vocabulary_or_u32_are_refused() {
        let info = ModelInfo {
            id: "m".into(),
            context: 64,
            vocab: 100,
            stop_tokens: vec![],
            tokenizer: None,
            template: None,
            speculative: false,
            prefill_step: std::sync::OnceLock::from(16),
            gamma: None,
        };
        let parse_ids = |body: &str| parse(Endpoint::Completions, body.as_bytes(), &info);
        assert_eq!(parse_ids(r#"{"prompt": [[5, 99]]}"#).unwrap().request.prompt, [5, 99]);
        for body in [r#"{"prompt": [100]}"#, r#"{"prompt": [4294967301]}"#] {
            let e = parse_ids(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("prompt"), "{body}");
            assert!(e.message.contains("outside the vocabulary"), "{}", e.message);
        }
        let e = parse_ids(r#"{"prompt": ["a", "b"]}"#).unwrap_err();
        assert!(e.message.contains("one prompt per request"), "{}", e.message);
    }
}
