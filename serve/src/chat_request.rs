//! A chat request's conversation to prompt ids, as transformers' `apply_chat_template` renders
//! it: the messages (assistant `tool_calls`, `tool` results with `tool_call_id`), the `tools`
//! declarations and `chat_template_kwargs` (such as `enable_thinking`) all reach the template.
//! `tool_choice` picks how the reply is read and started:
//! - `auto` (the default with tools): the model decides; its tool calls are parsed out.
//! - `none`: the tools are not declared to the model and its text is not read for calls.
//! - `required`: the reply starts with a tool call (its opening marker ends the prompt).
//! - `{"type": "function", "function": {"name": F}}`: the reply starts with a call of `F`.
//!
//! Forcing a prefix conditions the target's law on it; what follows is still sampled exactly.
//! An assistant message's `arguments` (OpenAI sends a JSON string) are parsed into an object,
//! so the template writes them in the model's own notation; a `tool` message without a `name`
//! gets the name of the call its `tool_call_id` answers.

use std::collections::HashMap;

use engine::chat::{chat_ids, chat_input_ids, ChatError};
use engine::ModelInfo;
use gemma4::chat_markup::{Markup, OutputParser, TOOL_CALL_START};
use gemma4::chat_template::ChatInput;
use serde_json::{json, Map, Value};

use crate::api_error::ApiError;
use crate::params::{ChatMessage, Content};

/// How a chat reply's text is read back.
#[derive(Clone, Debug, Default)]
pub struct ReplyFormat {
    /// The model writes Gemma-4 chat markup: thinking and tool calls are separated from the
    /// content (the markup tokens' text is kept in the decoded text for this).
    pub markup: bool,
    /// Tool calls are parsed out (tools declared and `tool_choice` not `none`).
    pub tool_calls: bool,
    /// Text the prompt already ends with that belongs to the reply (a forced tool call's
    /// opening), read before the generated text.
    pub forced: String,
    /// `parallel_tool_calls: false`: the reply carries at most its first call.
    pub single_call: bool,
}

impl ReplyFormat {
    /// A parser for the reply, primed with the forced text; none without markup.
    pub fn parser(&self) -> Option<OutputParser> {
        if !self.markup {
            return None;
        }
        let mut p = if self.tool_calls { OutputParser::new() } else { OutputParser::without_tool_calls() };
        // The forced text opens a call, so it completes no part yet.
        let _ = p.push(&self.forced);
        Some(p)
    }
}

/// A chat request's prompt.
pub struct ChatPrompt {
    /// The prompt's ids.
    pub ids: Vec<u32>,
    /// Special tokens whose text the decoded reply keeps (the markup).
    pub kept_tokens: Vec<u32>,
    /// How the reply is read.
    pub reply: ReplyFormat,
}

/// The chat fields of a request body.
pub struct ChatFields {
    /// `messages`.
    pub messages: Option<Vec<ChatMessage>>,
    /// `tools`.
    pub tools: Option<Value>,
    /// `tool_choice`.
    pub tool_choice: Option<Value>,
    /// `chat_template_kwargs`.
    pub kwargs: Option<Map<String, Value>>,
    /// `parallel_tool_calls` (default true).
    pub parallel_tool_calls: Option<bool>,
}

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];
/// Template variables a request's `chat_template_kwargs` may not replace.
const RESERVED: [&str; 6] = ["messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "pad_token"];

fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(Some(param), msg)
}

/// What `tool_choice` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Choice {
    None,
    Auto,
    Required,
    Named(String),
}

/// Checks the chat fields against the served model and builds the prompt.
pub fn chat_prompt(f: ChatFields, info: &ModelInfo) -> Result<ChatPrompt, ApiError> {
    let msgs = match f.messages {
        None => return Err(bad("messages", "'messages' is required")),
        Some(m) if m.is_empty() => return Err(bad("messages", "'messages' must not be empty")),
        Some(m) => m,
    };
    let tools = tools(f.tools)?;
    let choice = tool_choice(f.tool_choice, &tools)?;
    let kwargs = f.kwargs.unwrap_or_default();
    if let Some(k) = kwargs.keys().find(|k| RESERVED.contains(&k.as_str())) {
        return Err(bad(
            "chat_template_kwargs",
            format!("'chat_template_kwargs.{k}' is set by the server; it cannot be passed to the template"),
        ));
    }
    let messages = Value::Array(messages(msgs)?);
    let tok =
        info.tokenizer.as_ref().ok_or_else(|| bad("messages", "this model has no tokenizer, so it cannot chat"))?;
    let markup = Markup::of(tok);
    let declared = !tools.is_empty() && choice != Choice::None;
    let Some(template) = info.template.as_ref() else {
        if declared || !kwargs.is_empty() {
            let field = if declared { "tools" } else { "chat_template_kwargs" };
            return Err(bad(field, format!("this model has no chat template, so '{field}' cannot be used")));
        }
        let ids = chat_ids(tok, None, &messages).map_err(chat_error)?;
        return Ok(ChatPrompt { ids, kept_tokens: vec![], reply: ReplyFormat::default() });
    };
    if declared && markup.is_none() {
        return Err(bad(
            "tools",
            format!("this model's tokenizer has no tool-call markup ({TOOL_CALL_START}), so it cannot call tools"),
        ));
    }
    let forced = match &choice {
        Choice::Required => TOOL_CALL_START.to_string(),
        Choice::Named(name) => format!("{TOOL_CALL_START}call:{name}{{"),
        Choice::None | Choice::Auto => String::new(),
    };
    let tools = Value::Array(tools);
    let input = ChatInput {
        messages: &messages,
        tools: declared.then_some(&tools),
        kwargs: Some(&kwargs),
        add_generation_prompt: true,
    };
    let ids = chat_input_ids(tok, template, &input, &forced).map_err(chat_error)?;
    let single_call = f.parallel_tool_calls == Some(false);
    let reply = ReplyFormat { markup: markup.is_some(), tool_calls: declared, forced, single_call };
    Ok(ChatPrompt { ids, kept_tokens: markup.map(|m| m.kept).unwrap_or_default(), reply })
}

fn chat_error(e: ChatError) -> ApiError {
    match e {
        ChatError::Template(e) => bad("messages", format!("the chat template refused the messages: {}", e.detail)),
        ChatError::Tokenizer(e) => bad("messages", format!("the conversation cannot be encoded: {e}")),
    }
}

/// `tools`: a list of `{"type": "function", "function": {"name", "description"?,
/// "parameters"?}}`, passed on as given once checked.
fn tools(tools: Option<Value>) -> Result<Vec<Value>, ApiError> {
    let list = match tools {
        None => return Ok(vec![]),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(bad("tools", "'tools' must be a list of function tools")),
    };
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad(&at, format!("'{at}.type' must be \"function\" (the only kind of tool served)")));
        }
        let name = function_name(t).unwrap_or("");
        if !valid_name(name) {
            return Err(bad(
                &format!("{at}.function.name"),
                format!("'{at}.function.name' must be 1 to 64 letters, digits, '_' or '-', got {name:?}"),
            ));
        }
        if let Some(d) = t.pointer("/function/description").filter(|d| !d.is_null() && !d.is_string()) {
            return Err(bad(&format!("{at}.function.description"), format!("must be a string, got {d}")));
        }
        if let Some(p) = t.pointer("/function/parameters").filter(|p| !p.is_null() && !p.is_object()) {
            return Err(bad(&format!("{at}.function.parameters"), format!("must be a JSON-schema object, got {p}")));
        }
        if list[..i].iter().any(|u| function_name(u) == Some(name)) {
            return Err(bad(&format!("{at}.function.name"), format!("the tool '{name}' is declared twice")));
        }
    }
    Ok(list)
}

/// `function.name` of a tool declaration, a tool call or a named `tool_choice`.
fn function_name(v: &Value) -> Option<&str> {
    v.pointer("/function/name").and_then(Value::as_str)
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tool_choice`: `none`, `auto`, `required`, or a named function among `tools`.
fn tool_choice(choice: Option<Value>, tools: &[Value]) -> Result<Choice, ApiError> {
    let choice = match choice {
        None if tools.is_empty() => return Ok(Choice::None),
        None => return Ok(Choice::Auto),
        Some(c) => c,
    };
    let parsed = match &choice {
        Value::String(s) if s == "none" => Choice::None,
        Value::String(s) if s == "auto" => Choice::Auto,
        Value::String(s) if s == "required" => Choice::Required,
        Value::Object(_) if choice.get("type").and_then(Value::as_str) == Some("function") => {
            match function_name(&choice) {
                Some(name) => Choice::Named(name.to_string()),
                None => return Err(bad("tool_choice", "'tool_choice.function.name' is required")),
            }
        }
        other => {
            return Err(bad(
                "tool_choice",
                format!("'tool_choice' must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}, got {other}"),
            ))
        }
    };
    if tools.is_empty() && parsed != Choice::None {
        return Err(bad("tool_choice", "'tool_choice' needs 'tools'"));
    }
    if let Choice::Named(name) = &parsed {
        if !tools.iter().any(|t| function_name(t) == Some(name.as_str())) {
            return Err(bad("tool_choice", format!("'tool_choice' names '{name}', which 'tools' does not declare")));
        }
    }
    Ok(parsed)
}

/// A message's content as text: a string, or the concatenated text parts.
fn content_text(content: Option<Content>, at: &str) -> Result<Option<String>, ApiError> {
    let field = format!("{at}.content");
    match content {
        None => Ok(None),
        Some(Content::Text(s)) => Ok(Some(s)),
        Some(Content::Parts(parts)) => {
            let mut s = String::new();
            for p in parts {
                match (p.kind.as_deref(), p.text) {
                    (Some("text"), Some(t)) => s.push_str(&t),
                    _ => {
                        return Err(bad(
                            &field,
                            format!("{field}: only text parts ({{\"type\": \"text\", \"text\": …}}) are supported"),
                        ))
                    }
                }
            }
            Ok(Some(s))
        }
    }
}

/// The checked messages, as the template reads them.
fn messages(msgs: Vec<ChatMessage>) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(msgs.len());
    // Tool-call ids seen so far, to name the tool results that answer them.
    let mut call_names: HashMap<String, String> = HashMap::new();
    for (i, m) in msgs.into_iter().enumerate() {
        let at = format!("messages[{i}]");
        let field = format!("{at}.role");
        let role = match m.role {
            Some(r) if ROLES.contains(&r.as_str()) => r,
            Some(r) => {
                return Err(bad(
                    &field,
                    format!("{field} must be system, developer, user, assistant or tool, got '{r}'"),
                ))
            }
            None => return Err(bad(&field, format!("{field} is required and must be a string"))),
        };
        let content = content_text(m.content, &at)?;
        let mut msg = Map::new();
        msg.insert("role".into(), Value::String(role.clone()));
        match (role.as_str(), content) {
            (_, Some(c)) => {
                msg.insert("content".into(), Value::String(c));
            }
            ("assistant", None) => {}
            (_, None) => {
                let f = format!("{at}.content");
                return Err(bad(&f, format!("{f} must be a string or a list of text parts")));
            }
        }
        if let Some(calls) = m.tool_calls.filter(|c| !c.is_null()) {
            if role != "assistant" {
                return Err(bad(&format!("{at}.tool_calls"), "only assistant messages carry 'tool_calls'"));
            }
            let calls = tool_calls(calls, &at, &mut call_names)?;
            msg.insert("tool_calls".into(), Value::Array(calls));
        }
        if role == "tool" {
            if let Some(id) = &m.tool_call_id {
                msg.insert("tool_call_id".into(), Value::String(id.clone()));
            }
            let name = m.name.clone().or_else(|| m.tool_call_id.as_ref().and_then(|id| call_names.get(id).cloned()));
            if let Some(name) = name {
                msg.insert("name".into(), Value::String(name));
            }
        } else if let Some(name) = m.name {
            msg.insert("name".into(), Value::String(name));
        }
        out.push(Value::Object(msg));
    }
    Ok(out)
}

/// An assistant message's `tool_calls`, with JSON-string arguments parsed into objects.
fn tool_calls(calls: Value, at: &str, names: &mut HashMap<String, String>) -> Result<Vec<Value>, ApiError> {
    let field = format!("{at}.tool_calls");
    let Value::Array(list) = calls else {
        return Err(bad(&field, format!("'{field}' must be a list")));
    };
    let mut out = Vec::with_capacity(list.len());
    for (j, c) in list.into_iter().enumerate() {
        let here = format!("{field}[{j}]");
        let name = function_name(&c).filter(|n| valid_name(n)).ok_or_else(|| {
            bad(&format!("{here}.function.name"), format!("'{here}.function.name' must be a function name"))
        })?;
        let args_field = format!("{here}.function.arguments");
        let arguments = match c.pointer("/function/arguments") {
            None | Some(Value::Null) => json!({}),
            Some(Value::String(s)) if s.trim().is_empty() => json!({}),
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(v @ Value::Object(_)) => v,
                _ => return Err(bad(&args_field, format!("'{args_field}' must be a JSON object (as a string)"))),
            },
            Some(v @ Value::Object(_)) => v.clone(),
            Some(_) => return Err(bad(&args_field, format!("'{args_field}' must be a JSON object (as a string)"))),
        };
        let id = c.get("id").and_then(Value::as_str).map(str::to_string);
        if let Some(id) = &id {
            names.insert(id.clone(), name.to_string());
        }
        out.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}));
    }
    Ok(out)
}
