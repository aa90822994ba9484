//! Response bodies in OpenAI's shapes (completions, chat completions, their stream chunks,
//! the model list, health), with `usage.speculation` added for speculative sessions.

use engine::{Outcome, RequestCounts};
use serde::Serialize;
use spec_decode::SpecStats;

use crate::params::Endpoint;
use crate::reply::{finish_reason, Reply, ToolCallOut};

/// One SSE frame's JSON (serializing these bodies cannot fail: their keys are strings).
pub fn frame(body: &impl Serialize) -> String {
    serde_json::to_string(body).unwrap_or_else(|_| {
        r#"{"error": {"message": "a chunk could not be serialized", "type": "server_error"}}"#.to_string()
    })
}

/// `usage`: prompt and completion tokens, plus the speculation counters when the request was
/// decoded speculatively.
#[derive(Clone, Debug, Serialize)]
pub struct Usage {
    /// `prompt_tokens`: tokens in the prompt (for chat, the rendered conversation).
    pub prompt_tokens: usize,
    /// `completion_tokens`: tokens generated (a stop token that ended decoding is not one).
    pub completion_tokens: usize,
    /// `total_tokens`: `prompt_tokens` plus `completion_tokens`, what a client bills or
    /// budgets context by.
    pub total_tokens: usize,
    /// `prompt_tokens_details`: how much of the prompt the prompt cache served.
    pub prompt_tokens_details: PromptTokensDetails,
    /// `speculation` (a dspark extension, absent for plain decoding): how the drafter fared
    /// on this request.
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
    /// `drafted`: draft tokens the target verified (after confidence pruning), over all rounds.
    pub drafted: usize,
    /// `accepted`: draft tokens the target's verification accepted.
    pub accepted: usize,
    /// `rounds`: speculative rounds, i.e. verify forwards of the target that carried at least
    /// one draft.
    pub rounds: usize,
    /// `plain_steps`: target forwards after the prefill that carried no draft (the last token
    /// when only one was left to emit); not counted in `tau`.
    pub plain_steps: usize,
    /// `tau`: τ, the mean tokens emitted per round, (`accepted` + `rounds`) / `rounds`; 0 with
    /// no rounds. τ is the speed-up over plain decoding before the cost of drafting.
    pub tau: f64,
    /// `acceptance_rate`: `accepted` / `drafted`, from 0 to 1; 0 when nothing was drafted.
    pub acceptance_rate: f64,
    /// `drafted_by_position[i]`: rounds that verified a draft at block position i (0: the
    /// first draft after the round's bonus token).
    pub drafted_by_position: Vec<usize>,
    /// `accepted_by_position[i]`: rounds whose draft at block position i was accepted.
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
    /// `id`: the request's id (`cmpl-…` or `chatcmpl-…` and random hex), the same on every
    /// chunk of a stream.
    pub id: &'a str,
    /// `object`: `text_completion`, `chat.completion`, or `chat.completion.chunk` for a chat
    /// stream's chunks.
    pub object: &'static str,
    /// `created`: when the request arrived, in Unix seconds.
    pub created: u64,
    /// `model`: the served model's id.
    pub model: &'a str,
    /// `choices`: the one choice (`n` = 1); empty on the usage-only chunk.
    pub choices: Vec<Choice<'a>>,
    /// `usage`: on a whole response, and on a stream's usage-only chunk (the one
    /// `stream_options.include_usage` adds); absent on every other chunk, so a client that
    /// sums usage over chunks counts it once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// The one choice of a body (n = 1), in the endpoint's shape. `logprobs` is always null.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Choice<'a> {
    /// `/v1/completions`, whole or streamed.
    Text {
        /// `index`: always 0, the one choice.
        index: u32,
        /// `text`: the whole completion, or the text this chunk adds (empty on the last).
        text: &'a str,
        /// `finish_reason`: `stop` (a stop token or string) or `length` (`max_tokens`) once
        /// the request has ended; null on earlier chunks.
        finish_reason: Option<&'static str>,
        /// `logprobs`: always null (logprobs are not returned).
        logprobs: (),
    },
    /// `/v1/chat/completions`, whole.
    Message {
        /// `index`: always 0, the one choice.
        index: u32,
        /// `message`: the assistant's reply.
        message: Message<'a>,
        /// `finish_reason`: `stop` (a stop token or string), `length` (`max_tokens` or
        /// `max_completion_tokens`) or `tool_calls` (the reply called tools).
        finish_reason: Option<&'static str>,
        /// `logprobs`: always null (logprobs are not returned).
        logprobs: (),
    },
    /// `/v1/chat/completions`, streamed.
    Delta {
        /// `index`: always 0, the one choice.
        index: u32,
        /// `delta`: what this chunk adds to the assistant's message.
        delta: Delta<'a>,
        /// `finish_reason`: `stop`, `length` or `tool_calls` on the last chunk; null on
        /// earlier ones.
        finish_reason: Option<&'static str>,
        /// `logprobs`: always null (logprobs are not returned).
        logprobs: (),
    },
}

/// The assistant's message of a whole chat completion.
#[derive(Clone, Debug, Serialize)]
pub struct Message<'a> {
    /// `role`: always `assistant`.
    pub role: &'static str,
    /// `content`: the generated text, cut before a matched stop string, without thinking or
    /// tool-call markup; null when the reply is only tool calls.
    pub content: Option<&'a str>,
    /// `reasoning_content`: the thinking text, when the model thought (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<&'a str>,
    /// `tool_calls`: the calls the reply made (absent when none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<&'a [ToolCallOut]>,
}

/// What a chat stream chunk adds to the message (`{}` on the last chunk).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Delta<'a> {
    /// `role`: `assistant` on the stream's first chunk only; absent after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// `content`: the text this chunk adds (empty on the first chunk); absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
    /// `reasoning_content`: thinking text this chunk adds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<&'a str>,
    /// `tool_calls`: a call completed in this chunk, whole (with its `index`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// What every body of one request shares.
#[derive(Clone, Debug)]
pub struct Envelope {
    /// The endpoint the request came to: it picks the choice shape and `object`.
    pub endpoint: Endpoint,
    /// The request's `id` (`cmpl-…` or `chatcmpl-…`, see [`crate::ids`]), also its label in
    /// the engine's log.
    pub id: String,
    /// The request's `created`, in Unix seconds.
    pub created: u64,
    /// The served model's id, echoed as `model`.
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

    /// The whole (non-streamed) response; a chat reply is read as `reply` (its markup) says.
    pub fn full<'a>(&'a self, o: &'a Outcome, reply: Option<&'a Reply>) -> Body<'a> {
        let choice = match (self.endpoint, reply) {
            (Endpoint::Completions, _) => {
                Choice::Text { index: 0, text: &o.text, finish_reason: Some(o.finish.as_str()), logprobs: () }
            }
            (Endpoint::Chat, None) => Choice::Message {
                index: 0,
                message: Message {
                    role: "assistant",
                    content: Some(&o.text),
                    reasoning_content: None,
                    tool_calls: None,
                },
                finish_reason: Some(o.finish.as_str()),
                logprobs: (),
            },
            (Endpoint::Chat, Some(r)) => {
                let calls = !r.tool_calls.is_empty();
                let message = Message {
                    role: "assistant",
                    content: (!calls || !r.content.is_empty()).then_some(r.content.as_str()),
                    reasoning_content: (!r.reasoning.is_empty()).then_some(r.reasoning.as_str()),
                    tool_calls: calls.then_some(r.tool_calls.as_slice()),
                };
                Choice::Message {
                    index: 0,
                    message,
                    finish_reason: Some(finish_reason(o.finish, r.tool_calls.len())),
                    logprobs: (),
                }
            }
        };
        self.body(false, vec![choice], Some(Usage::of(o)))
    }

    /// A chat stream chunk adding `delta`.
    pub fn delta_chunk(&self, delta: Delta<'_>) -> String {
        frame(&self.body(true, vec![Choice::Delta { index: 0, delta, finish_reason: None, logprobs: () }], None))
    }

    /// A stream chunk carrying `text` (chat: as a content delta), and `finish` on the last.
    pub fn chunk<'a>(&'a self, text: &'a str, finish: Option<&'static str>) -> Body<'a> {
        let choice = match self.endpoint {
            Endpoint::Completions => Choice::Text { index: 0, text, finish_reason: finish, logprobs: () },
            Endpoint::Chat => {
                let delta = if finish.is_some() && text.is_empty() {
                    Delta::default()
                } else {
                    Delta { content: Some(text), ..Delta::default() }
                };
                Choice::Delta { index: 0, delta, finish_reason: finish, logprobs: () }
            }
        };
        self.body(true, vec![choice], None)
    }

    /// The last chunk of a stream: the finish reason, `tool_calls` when the reply made
    /// `calls` and stopped (the usage, if asked for, follows in [`Envelope::usage_chunk`]).
    pub fn last_chunk<'a>(&'a self, o: &Outcome, calls: usize) -> Body<'a> {
        self.chunk("", Some(finish_reason(o.finish, calls)))
    }

    /// The chat stream's first chunk: the assistant role, no content yet.
    pub fn role_chunk(&self) -> Body<'_> {
        let delta = Delta { role: Some("assistant"), content: Some(""), ..Delta::default() };
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
    /// `object`: always `list`.
    pub object: &'static str,
    /// `data`: the one model this server serves.
    pub data: [ModelCard<'a>; 1],
}

/// The served model in the list.
#[derive(Clone, Debug, Serialize)]
pub struct ModelCard<'a> {
    /// `id`: the model id, what a request's `model` must name (or omit).
    pub id: &'a str,
    /// `object`: always `model`.
    pub object: &'static str,
    /// `created`: always 0 (a local checkpoint has no publication time).
    pub created: u64,
    /// `owned_by`: always `dspark`.
    pub owned_by: &'static str,
}

impl<'a> ModelCard<'a> {
    /// The card of the served model (`GET /v1/models/{id}`).
    pub fn of(id: &'a str) -> ModelCard<'a> {
        ModelCard { id, object: "model", created: 0, owned_by: "dspark" }
    }
}

impl<'a> ModelList<'a> {
    /// The list of the one model served.
    pub fn of(id: &'a str) -> ModelList<'a> {
        ModelList { object: "list", data: [ModelCard::of(id)] }
    }
}

/// `GET /health`.
#[derive(Clone, Debug, Serialize)]
pub struct Health<'a> {
    /// `status`: `ok` whenever the server answers (the engine has loaded the model).
    pub status: &'static str,
    /// `model`: the served model's id.
    pub model: &'a str,
    /// `requests`: queued, active, completed, cancelled and failed request counts.
    pub requests: RequestCounts,
}
