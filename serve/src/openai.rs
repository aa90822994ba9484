//! Response bodies in OpenAI's shapes (completions, chat completions, their stream chunks,
//! the model list), with `usage.speculation` added for speculative sessions.

use serde_json::{json, Value};
use spec_decode::SpecStats;

use crate::params::Endpoint;
use engine::Outcome;

/// `usage`: prompt and completion tokens, plus the speculation counters when the request was
/// decoded speculatively.
pub fn usage(o: &Outcome) -> Value {
    let mut u = json!({
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.tokens.len(),
        "total_tokens": o.prompt_tokens + o.tokens.len(),
        "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
    });
    if let Some(s) = &o.speculation {
        u["speculation"] = speculation(s);
    }
    u
}

/// Drafted, accepted, rounds, τ and acceptance by block position.
pub fn speculation(s: &SpecStats) -> Value {
    let by_pos: Vec<Value> = s
        .drafted_by_pos
        .iter()
        .zip(&s.accepted_by_pos)
        .map(|(&d, &a)| if d == 0 { Value::Null } else { json!(a as f64 / d as f64) })
        .collect();
    json!({
        "drafted": s.drafted,
        "accepted": s.accepted,
        "rounds": s.rounds,
        "plain_steps": s.plain_steps,
        "tau": s.tau(),
        "acceptance_rate": s.acceptance_rate(),
        "drafted_by_position": s.drafted_by_pos,
        "accepted_by_position": s.accepted_by_pos,
        "acceptance_by_position": by_pos,
    })
}

/// What every body of one request shares.
#[derive(Clone, Debug)]
pub struct Envelope {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Envelope {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    /// The whole (non-streamed) response.
    pub fn full(&self, o: &Outcome) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completions => {
                json!({"index": 0, "text": o.text, "finish_reason": o.finish.as_str(), "logprobs": null})
            }
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": o.text},
                "finish_reason": o.finish.as_str(),
                "logprobs": null,
            }),
        };
        json!({
            "id": self.id, "object": self.object(false), "created": self.created, "model": self.model,
            "choices": [choice], "usage": usage(o),
        })
    }

    /// A stream chunk carrying `text` (chat: as a content delta), and `finish` on the last.
    pub fn chunk(&self, text: &str, finish: Option<&str>) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completions => json!({"index": 0, "text": text, "finish_reason": finish, "logprobs": null}),
            Endpoint::Chat => {
                let delta = if finish.is_some() && text.is_empty() { json!({}) } else { json!({"content": text}) };
                json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null})
            }
        };
        json!({
            "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
            "choices": [choice],
        })
    }

    /// The chat stream's first chunk: the assistant role, no content yet.
    pub fn role_chunk(&self) -> Value {
        json!({
            "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null, "logprobs": null}],
        })
    }

    /// The usage-only chunk (`stream_options.include_usage`): no choices.
    pub fn usage_chunk(&self, o: &Outcome) -> Value {
        json!({
            "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
            "choices": [], "usage": usage(o),
        })
    }
}

/// `GET /v1/models`.
pub fn models(id: &str) -> Value {
    json!({"object": "list", "data": [{"id": id, "object": "model", "created": 0, "owned_by": "dspark"}]})
}
