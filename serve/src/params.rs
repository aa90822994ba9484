//! Request bodies of `/v1/completions` and `/v1/chat/completions`, read field by field from
//! the JSON so that every refusal names the field at fault (OpenAI's `param`). Unknown fields
//! are ignored, as OpenAI-compatible servers do; known fields this server cannot honour
//! (`n` > 1, `logprobs`, `echo`, penalties, …) are refused rather than silently dropped.

use gemma4::generate::GenerateConfig;
use gemma4::sampling::SamplerConfig;
use serde_json::{Map, Value};

use engine::chat::{chat_ids, text_ids, ChatError};
use engine::{ModelInfo, Request};

use crate::api_error::ApiError;

/// Which endpoint a body was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// A validated request.
#[derive(Clone, Debug)]
pub struct Parsed {
    pub request: Request,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage and no choices.
    pub include_usage: bool,
}

/// Default completion budget of `/v1/completions` (OpenAI's) and of chat (bounded by the
/// context left).
const DEFAULT_MAX_TOKENS: usize = 16;
const DEFAULT_CHAT_MAX_TOKENS: usize = 256;
/// Stop strings one request may give.
const MAX_STOPS: usize = 16;

type Fields = Map<String, Value>;

fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(Some(param), msg)
}

fn present<'a>(f: &'a Fields, name: &str) -> Option<&'a Value> {
    f.get(name).filter(|v| !v.is_null())
}

fn number(f: &Fields, name: &str) -> Result<Option<f64>, ApiError> {
    match present(f, name) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => Err(bad(name, format!("'{name}' must be a number, got {v}"))),
        },
    }
}

fn integer(f: &Fields, name: &str) -> Result<Option<i64>, ApiError> {
    match present(f, name) {
        None => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or_else(|| bad(name, format!("'{name}' must be an integer, got {v}"))),
    }
}

fn boolean(f: &Fields, name: &str) -> Result<Option<bool>, ApiError> {
    match present(f, name) {
        None => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| bad(name, format!("'{name}' must be true or false, got {v}"))),
    }
}

/// Refuses a field unless it is absent or has one of the values meaning "off".
fn only_off(f: &Fields, name: &str, off: &[Value], what: &str) -> Result<(), ApiError> {
    match present(f, name) {
        Some(v) if !off.contains(v) => Err(bad(name, format!("'{name}' is not supported by this server ({what})"))),
        _ => Ok(()),
    }
}

/// Parses and validates a body for `endpoint` against the served model.
pub fn parse(endpoint: Endpoint, body: &[u8], info: &ModelInfo) -> Result<Parsed, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(None, format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(f) = v else {
        return Err(ApiError::invalid(None, "the request body must be a JSON object"));
    };
    match present(&f, "model") {
        None => {}
        Some(Value::String(m)) if *m == info.id => {}
        Some(Value::String(m)) => {
            return Err(ApiError::invalid_code(
                "model",
                "model_not_found",
                format!("the model '{m}' does not exist; this server serves '{}'", info.id),
            ))
        }
        Some(v) => return Err(bad("model", format!("'model' must be a string, got {v}"))),
    }
    if let Some(n) = integer(&f, "n")? {
        if n != 1 {
            return Err(bad("n", format!("'n' must be 1 (one choice per request), got {n}")));
        }
    }
    only_off(&f, "best_of", &[Value::from(1)], "one candidate per request")?;
    only_off(&f, "echo", &[Value::from(false)], "the prompt is not echoed")?;
    only_off(&f, "logprobs", &[Value::from(false), Value::from(0)], "no logprobs are returned")?;
    only_off(&f, "top_logprobs", &[Value::from(0)], "no logprobs are returned")?;
    for p in ["presence_penalty", "frequency_penalty"] {
        only_off(&f, p, &[Value::from(0), Value::from(0.0)], "penalties would change the target's distribution")?;
    }
    only_off(&f, "suffix", &[], "no insertion mode")?;
    only_off(&f, "tools", &[Value::Array(vec![])], "no tool calls")?;

    let stream = boolean(&f, "stream")?.unwrap_or(false);
    let include_usage = match present(&f, "stream_options") {
        None => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(bad("stream_options", format!("'include_usage' must be true or false, got {v}"))),
        },
        Some(v) => return Err(bad("stream_options", format!("'stream_options' must be an object, got {v}"))),
    };

    let temperature = number(&f, "temperature")?.unwrap_or(1.0);
    if let Err(e) = gemma4::sampling::check_temperature(temperature) {
        return Err(bad("temperature", format!("'temperature': {e}")));
    }
    let top_p = number(&f, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(bad("top_p", format!("'top_p' must be in (0, 1], got {top_p}")));
    }
    let min_p = number(&f, "min_p")?.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(bad("min_p", format!("'min_p' must be in [0, 1], got {min_p}")));
    }
    let top_k = match integer(&f, "top_k")? {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 && (k as u64) < info.vocab as u64 => k as usize,
        Some(k) => {
            return Err(bad(
                "top_k",
                format!("'top_k' must be 0 or -1 (off) or in 1..={} (below the vocabulary), got {k}", info.vocab - 1),
            ))
        }
    };
    let seed = match present(&f, "seed") {
        None => fresh_seed(),
        Some(v) => v.as_u64().ok_or_else(|| bad("seed", format!("'seed' must be a non-negative integer, got {v}")))?,
    };
    let stop = match present(&f, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| match s {
                Value::String(s) => Ok(s.clone()),
                other => Err(bad("stop", format!("'stop' must hold strings, got {other}"))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(v) => return Err(bad("stop", format!("'stop' must be a string or a list of strings, got {v}"))),
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

    let (prompt, prompt_field) = match endpoint {
        Endpoint::Completions => (completion_prompt(&f, info)?, "prompt"),
        Endpoint::Chat => (chat_prompt(&f, info)?, "messages"),
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
    let max_field = if endpoint == Endpoint::Chat && present(&f, "max_completion_tokens").is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let max_tokens = match integer(&f, max_field)? {
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

    let sampler = SamplerConfig { temperature, top_p, top_k, min_p, min_tokens_to_keep: 1 };
    let generate = GenerateConfig {
        max_tokens,
        sampler,
        seed,
        prefill_step: info.prefill_step,
        stop_tokens: info.stop_tokens.clone(),
    };
    Ok(Parsed {
        request: Request { prompt, generate, stop, gamma: info.gamma, pruning: Default::default() },
        stream,
        include_usage,
    })
}

/// A seed for a sampled request that gave none (OpenAI: sampling is then not reproducible).
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    t ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
}

fn checked_ids(ids: Vec<u32>, info: &ModelInfo, field: &str) -> Result<Vec<u32>, ApiError> {
    match ids.iter().find(|&&t| t as usize >= info.vocab) {
        Some(t) => {
            Err(bad(field, format!("'{field}': token id {t} is outside the vocabulary of {} tokens", info.vocab)))
        }
        None => Ok(ids),
    }
}

fn completion_prompt(f: &Fields, info: &ModelInfo) -> Result<Vec<u32>, ApiError> {
    let encode = |text: &str| -> Result<Vec<u32>, ApiError> {
        let tok = info
            .tokenizer
            .as_ref()
            .ok_or_else(|| bad("prompt", "this model has no tokenizer; send the prompt as a list of token ids"))?;
        let ids = text_ids(tok, text).map_err(|e| bad("prompt", format!("the prompt cannot be encoded: {e}")))?;
        checked_ids(ids, info, "prompt")
    };
    match present(f, "prompt") {
        None => Err(bad("prompt", "'prompt' is required")),
        Some(Value::String(s)) => encode(s),
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            let ids = a.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).unwrap_or(u32::MAX)).collect();
            checked_ids(ids, info, "prompt")
        }
        Some(Value::Array(a)) if a.len() == 1 => match &a[0] {
            Value::String(s) => encode(s),
            Value::Array(ids) if ids.iter().all(Value::is_u64) => {
                let ids =
                    ids.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).unwrap_or(u32::MAX)).collect();
                checked_ids(ids, info, "prompt")
            }
            other => Err(bad("prompt", format!("'prompt' must be a string or a list of token ids, got {other}"))),
        },
        Some(Value::Array(a)) if a.len() > 1 && a.iter().all(|p| p.is_string() || p.is_array()) => {
            Err(bad("prompt", format!("one prompt per request (n = 1), got {}", a.len())))
        }
        Some(v) => Err(bad("prompt", format!("'prompt' must be a string or a list of token ids, got {v}"))),
    }
}

fn chat_prompt(f: &Fields, info: &ModelInfo) -> Result<Vec<u32>, ApiError> {
    let msgs = match present(f, "messages") {
        None => return Err(bad("messages", "'messages' is required")),
        Some(Value::Array(a)) if a.is_empty() => return Err(bad("messages", "'messages' must not be empty")),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(bad("messages", format!("'messages' must be a list of messages, got {v}"))),
    };
    let mut plain = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let at = |what: &str| format!("messages[{i}]{what}");
        let Value::Object(m) = m else {
            return Err(bad(&at(""), format!("{} must be an object with 'role' and 'content'", at(""))));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) if ["system", "developer", "user", "assistant", "tool"].contains(&r.as_str()) => {
                r.clone()
            }
            Some(Value::String(r)) => {
                return Err(bad(
                    &at(".role"),
                    format!("{} must be system, developer, user, assistant or tool, got '{r}'", at(".role")),
                ))
            }
            _ => return Err(bad(&at(".role"), format!("{} is required and must be a string", at(".role")))),
        };
        // Content as text: a string, or a list of {"type": "text", "text": …} parts.
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None if role == "assistant" => String::new(),
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => s.push_str(t),
                        _ => {
                            return Err(bad(
                                &at(".content"),
                                format!(
                                    "{}: only text parts ({{\"type\": \"text\", \"text\": …}}) are supported",
                                    at(".content")
                                ),
                            ))
                        }
                    }
                }
                s
            }
            _ => {
                return Err(bad(
                    &at(".content"),
                    format!("{} must be a string or a list of text parts", at(".content")),
                ))
            }
        };
        plain.push(serde_json::json!({"role": role, "content": content}));
    }
    let tok =
        info.tokenizer.as_ref().ok_or_else(|| bad("messages", "this model has no tokenizer, so it cannot chat"))?;
    let ids = chat_ids(tok, info.template.as_ref(), &Value::Array(plain)).map_err(|e| match e {
        ChatError::Template(e) => bad("messages", format!("the chat template refused the messages: {}", e.detail)),
        ChatError::Tokenizer(e) => bad("messages", format!("the conversation cannot be encoded: {e}")),
    })?;
    checked_ids(ids, info, "messages")
}
