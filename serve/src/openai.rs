//! Response bodies in OpenAI's shapes (completions, chat completions, their stream chunks,
//! the model list, health), with `usage.speculation` added for speculative sessions.

use engine::{Outcome, RequestCounts};
use serde::Serialize;
use spec_decode::SpecStats;

use crate::params::Endpoint;

/// `usage`: prompt and completion tokens, plus the speculation counters when the request was
/// decoded speculatively.
#[derive(Clone, Debug, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculation: Option<Speculation>,
}

/// `usage.prompt_tokens_details`.
#[derive(Clone, Debug, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose prefill came from the prompt cache.
    pub cached_tokens: usize,
}

/// `usage.speculation`: drafted, accepted, rounds, τ and acceptance by block position.
#[derive(Clone, Debug, Serialize)]
pub struct Speculation {
    pub drafted: usize,
    pub accepted: usize,
    pub rounds: usize,
    pub plain_steps: usize,
    pub tau: f64,
    pub acceptance_rate: f64,
    pub drafted_by_position: Vec<usize>,
    pub accepted_by_position: Vec<usize>,
    /// Accepted over drafted at each position; null where nothing was drafted.
    pub acceptance_by_position: Vec<Option<f64>>,
}

impl Usage {
    /// The usage of a finished session.
    pub fn of(o: &Outcome) -> Usage {
        Usage {
            prompt_tokens: o.prompt_tokens,
            completion_tokens: o.tokens.len(),
            total_tokens: o.prompt_tokens + o.tokens.len(),
            prompt_tokens_details: PromptTokensDetails { cached_tokens: o.cached_tokens },
            speculation: o.speculation.as_ref().map(Speculation::of),
        }
    }
}

impl Speculation {
    /// The counters of a speculative session.
    pub fn of(s: &SpecStats) -> Speculation {
        let by_pos = s
            .drafted_by_pos
            .iter()
            .zip(&s.accepted_by_pos)
            .map(|(&d, &a)| (d > 0).then(|| a as f64 / d as f64))
            .collect();
        Speculation {
            drafted: s.drafted,
            accepted: s.accepted,
            rounds: s.rounds,
            plain_steps: s.plain_steps,
            tau: s.tau(),
            acceptance_rate: s.acceptance_rate(),
            drafted_by_position: s.drafted_by_pos.clone(),
            accepted_by_position: s.accepted_by_pos.clone(),
            acceptance_by_position: by_pos,
        }
    }
}

/// A completion, a chat completion, or a chunk of either's stream.
#[derive(Clone, Debug, Serialize)]
pub struct Body<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<Choice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// The one choice of a body (n = 1), in the endpoint's shape. `logprobs` is always null.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Choice<'a> {
    /// `/v1/completions`, whole or streamed.
    Text { index: u32, text: &'a str, finish_reason: Option<&'static str>, logprobs: () },
    /// `/v1/chat/completions`, whole.
    Message { index: u32, message: Message<'a>, finish_reason: Option<&'static str>, logprobs: () },
    /// `/v1/chat/completions`, streamed.
    Delta { index: u32, delta: Delta<'a>, finish_reason: Option<&'static str>, logprobs: () },
}

/// The assistant's message of a whole chat completion.
#[derive(Clone, Debug, Serialize)]
pub struct Message<'a> {
    pub role: &'static str,
    pub content: &'a str,
}

/// What a chat stream chunk adds to the message (`{}` on the last chunk).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
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
    fn body<'a>(&'a self, chunk: bool, choices: Vec<Choice<'a>>, usage: Option<Usage>) -> Body<'a> {
        let object = match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        };
        Body { id: &self.id, object, created: self.created, model: &self.model, choices, usage }
    }

    /// The whole (non-streamed) response.
    pub fn full<'a>(&'a self, o: &'a Outcome) -> Body<'a> {
        let finish_reason = Some(o.finish.as_str());
        let choice = match self.endpoint {
            Endpoint::Completions => Choice::Text { index: 0, text: &o.text, finish_reason, logprobs: () },
            Endpoint::Chat => Choice::Message {
                index: 0,
                message: Message { role: "assistant", content: &o.text },
                finish_reason,
                logprobs: (),
            },
        };
        self.body(false, vec![choice], Some(Usage::of(o)))
    }

    /// A stream chunk carrying `text` (chat: as a content delta), and `finish` on the last.
    pub fn chunk<'a>(&'a self, text: &'a str, finish: Option<&'static str>) -> Body<'a> {
        let choice = match self.endpoint {
            Endpoint::Completions => Choice::Text { index: 0, text, finish_reason: finish, logprobs: () },
            Endpoint::Chat => {
                let delta = if finish.is_some() && text.is_empty() {
                    Delta::default()
                } else {
                    Delta { role: None, content: Some(text) }
                };
                Choice::Delta { index: 0, delta, finish_reason: finish, logprobs: () }
            }
        };
        self.body(true, vec![choice], None)
    }

    /// The last chunk of a stream: the finish reason, and the usage.
    pub fn last_chunk<'a>(&'a self, o: &Outcome) -> Body<'a> {
        Body { usage: Some(Usage::of(o)), ..self.chunk("", Some(o.finish.as_str())) }
    }

    /// The chat stream's first chunk: the assistant role, no content yet.
    pub fn role_chunk(&self) -> Body<'_> {
        let delta = Delta { role: Some("assistant"), content: Some("") };
        self.body(true, vec![Choice::Delta { index: 0, delta, finish_reason: None, logprobs: () }], None)
    }

    /// The usage-only chunk (`stream_options.include_usage`): no choices.
    pub fn usage_chunk(&self, o: &Outcome) -> Body<'_> {
        self.body(true, vec![], Some(Usage::of(o)))
    }
}

/// `GET /v1/models`.
#[derive(Clone, Debug, Serialize)]
pub struct ModelList<'a> {
    pub object: &'static str,
    pub data: [ModelCard<'a>; 1],
}

/// The served model in the list.
#[derive(Clone, Debug, Serialize)]
pub struct ModelCard<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

impl<'a> ModelList<'a> {
    /// The list of the one model served.
    pub fn of(id: &'a str) -> ModelList<'a> {
        ModelList { object: "list", data: [ModelCard { id, object: "model", created: 0, owned_by: "dspark" }] }
    }
}

/// `GET /health`.
#[derive(Clone, Debug, Serialize)]
pub struct Health<'a> {
    pub status: &'static str,
    pub model: &'a str,
    pub requests: RequestCounts,
}
