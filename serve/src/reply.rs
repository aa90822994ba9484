//! A chat reply's text read through the chat markup ([`crate::chat_request::ReplyFormat`]):
//! content, thinking (`reasoning_content`) and tool calls in OpenAI's shape (`tool_calls`, with
//! `finish_reason: "tool_calls"` when the reply ended by calling).

use engine::FinishReason;
use gemma4::chat_markup::{Part, ToolCall};
use serde::Serialize;

use crate::ids;

/// One tool call of a reply (`message.tool_calls[i]`, or a stream delta's, with its `index`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolCallOut {
    /// `index`: the call's position in the reply, on stream deltas only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// `id`: `call_` and random hex, what the `tool` message answering it names.
    pub id: String,
    /// `type`: always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `function`: the name and the arguments.
    pub function: FunctionCall,
}

/// `function` of a tool call.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunctionCall {
    /// `name`: the function called.
    pub name: String,
    /// `arguments`: a JSON object, as a string (OpenAI's shape).
    pub arguments: String,
}

impl ToolCallOut {
    /// The OpenAI form of a parsed call, `index` set for stream deltas.
    pub fn of(call: &ToolCall, index: Option<usize>) -> ToolCallOut {
        // A failing random source still gets a unique-enough id within the reply.
        let id =
            ids::fresh("call").map_or_else(|_| format!("call_{}", index.unwrap_or(0)), |id| id.replacen('-', "_", 1));
        ToolCallOut {
            index,
            id,
            kind: "function",
            function: FunctionCall { name: call.name.clone(), arguments: call.arguments.to_string() },
        }
    }
}

/// A whole reply, read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reply {
    /// Text for the user.
    pub content: String,
    /// Thinking text.
    pub reasoning: String,
    /// Tool calls, in order.
    pub tool_calls: Vec<ToolCallOut>,
}

impl Reply {
    /// Collects parts into a reply; `single_call` keeps only the first tool call.
    pub fn of(parts: impl IntoIterator<Item = Part>, single_call: bool) -> Reply {
        let mut r = Reply::default();
        for p in parts {
            match p {
                Part::Content(s) => r.content.push_str(&s),
                Part::Reasoning(s) => r.reasoning.push_str(&s),
                Part::ToolCall(_) if single_call && !r.tool_calls.is_empty() => {}
                Part::ToolCall(c) => r.tool_calls.push(ToolCallOut::of(&c, None)),
            }
        }
        r
    }
}

/// OpenAI's `finish_reason`: `tool_calls` when a reply that stopped (rather than ran out of
/// tokens) made calls, else the engine's own.
pub fn finish_reason(finish: FinishReason, calls: usize) -> &'static str {
    match finish {
        FinishReason::Stop if calls > 0 => "tool_calls",
        f => f.as_str(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gemma4::chat_markup::OutputParser;

    #[test]
    fn calls_content_and_reasoning_are_collected() {
        let text =
            "<|channel>thought\nx<channel|>ok <|tool_call>call:f{a:1}<tool_call|><|tool_call>call:g{}<tool_call|>";
        let all = Reply::of(OutputParser::parse(text), false);
        assert_eq!((all.content.as_str(), all.reasoning.as_str()), ("ok ", "x"));
        let names: Vec<&str> = all.tool_calls.iter().map(|c| c.function.name.as_str()).collect();
        assert_eq!(names, ["f", "g"]);
        assert_eq!(all.tool_calls[0].function.arguments, r#"{"a":1}"#);
        assert!(all.tool_calls[0].id.starts_with("call_") && all.tool_calls[0].id != all.tool_calls[1].id);
        let one = Reply::of(OutputParser::parse(text), true);
        assert_eq!(one.tool_calls.len(), 1, "parallel_tool_calls: false keeps the first call");
        assert_eq!(finish_reason(FinishReason::Stop, 1), "tool_calls");
        assert_eq!(finish_reason(FinishReason::Length, 1), "length");
        assert_eq!(finish_reason(FinishReason::Stop, 0), "stop");
    }
}
