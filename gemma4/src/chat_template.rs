//! A tokenizer's chat template, rendered the way Hugging Face's `apply_chat_template` does:
//! Jinja (minijinja) with `trim_blocks` and `lstrip_blocks`, Python string methods,
//! `raise_exception`, and the special tokens (`bos_token`, `eos_token`, `pad_token`) as
//! variables. It lives next to the tokenizer because every front end that turns a conversation
//! into ids (data regeneration, the server) needs the same rendering.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::tokenizer::Tokenizer;

/// A template that failed to load, compile or render: `origin` names where it came from.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: {detail}")]
pub struct ChatTemplateError {
    /// Where the template came from (a file path or the tokenizer config).
    pub origin: String,
    /// MiniJinja's message.
    pub detail: String,
}

/// One compiled-once chat template (see the module docs).
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: String,
    vars: BTreeMap<String, String>,
    origin: String,
}

impl ChatTemplate {
    /// The template of `tok`: its `tokenizer_config.json`'s `chat_template`, else a
    /// `chat_template.jinja` file next to `tokenizer.json` (where newer checkpoints keep it), else
    /// none. A list of named templates (kept by the tokenizer as its JSON text) yields the one
    /// named `default`, else the first.
    pub fn of(tok: &Tokenizer) -> Result<Option<ChatTemplate>, ChatTemplateError> {
        let jinja = tok.path().with_file_name("chat_template.jinja");
        let (src, origin) = match tok.chat_template() {
            Some(src) => (src.to_string(), tok.path().with_file_name("tokenizer_config.json")),
            None if jinja.is_file() => {
                let src = mlx_core::files::read_text(&jinja, mlx_core::files::JSON_LIMIT)
                    .map_err(|e| ChatTemplateError { origin: jinja.display().to_string(), detail: e.to_string() })?;
                (src, jinja)
            }
            None => return Ok(None),
        };
        let src = src.as_str();
        let origin = format!("chat template of {}", origin.display());
        let source = match serde_json::from_str::<Vec<Value>>(src) {
            Ok(list) if src.trim_start().starts_with('[') => {
                let named = |want: Option<&str>| {
                    list.iter().find(|t| want.is_none() || t.get("name").and_then(Value::as_str) == want)
                };
                named(Some("default"))
                    .or_else(|| named(None))
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| ChatTemplateError {
                        origin: origin.clone(),
                        detail: "a list of templates needs {\"name\", \"template\"} entries".into(),
                    })?
                    .to_string()
            }
            _ => src.to_string(),
        };
        let specials = [("bos_token", tok.bos_token()), ("eos_token", tok.eos_token()), ("pad_token", tok.pad_token())]
            .map(|(name, t)| (name, t.map(|t| t.content.clone()).unwrap_or_default()));
        let specials: Vec<(&str, &str)> = specials.iter().map(|(n, v)| (*n, v.as_str())).collect();
        ChatTemplate::from_source(source, &specials, origin).map(Some)
    }

    /// A template from its Jinja source, with `specials` as `(name, text)` variables and
    /// `origin` naming it in errors; compiled once here, so a broken template fails before
    /// anything runs.
    pub fn from_source(
        source: impl Into<String>,
        specials: &[(&str, &str)],
        origin: impl Into<String>,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        let vars = specials.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let t = ChatTemplate { source: source.into(), vars, origin: origin.into() };
        t.env().template_from_str(&t.source).map_err(|e| t.error(e))?;
        Ok(t)
    }

    fn env(&self) -> minijinja::Environment<'_> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env
    }

    fn error(&self, e: minijinja::Error) -> ChatTemplateError {
        let mut detail = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            detail.push_str(&format!(": {s}"));
            src = s.source();
        }
        ChatTemplateError { origin: self.origin.clone(), detail }
    }

    /// The text of a one-message user conversation with the generation prompt appended.
    pub fn render(&self, prompt: &str) -> Result<String, ChatTemplateError> {
        self.render_messages(&serde_json::json!([{"role": "user", "content": prompt}]), true)
    }

    /// The text of a conversation: `messages` is a JSON list of `{"role", "content", …}`
    /// objects, passed to the template as they are.
    pub fn render_messages(&self, messages: &Value, add_generation_prompt: bool) -> Result<String, ChatTemplateError> {
        self.render_chat(&ChatInput { messages, tools: None, kwargs: None, add_generation_prompt })
    }

    /// The text of a conversation with tool declarations and extra template variables, as
    /// `apply_chat_template(messages, tools=…, add_generation_prompt=…, **kwargs)` renders it.
    pub fn render_chat(&self, input: &ChatInput<'_>) -> Result<String, ChatTemplateError> {
        let env = self.env();
        let tmpl = env.template_from_str(&self.source).map_err(|e| self.error(e))?;
        let mut ctx: BTreeMap<&str, minijinja::Value> = BTreeMap::new();
        for (k, v) in input.kwargs.into_iter().flatten() {
            ctx.insert(k.as_str(), minijinja::Value::from_serialize(v));
        }
        for (k, v) in &self.vars {
            ctx.insert(k.as_str(), minijinja::Value::from(v.as_str()));
        }
        ctx.insert("messages", minijinja::Value::from_serialize(input.messages));
        // `tools` is None (falsy) without declarations, as transformers passes it.
        ctx.insert("tools", input.tools.map_or(minijinja::Value::from(()), minijinja::Value::from_serialize));
        ctx.insert("add_generation_prompt", minijinja::Value::from(input.add_generation_prompt));
        tmpl.render(ctx).map_err(|e| self.error(e))
    }
}

/// A conversation to render: see [`ChatTemplate::render_chat`].
#[derive(Clone, Copy, Debug)]
pub struct ChatInput<'a> {
    /// A JSON list of messages (`role`, `content`, and `tool_calls`, `tool_call_id`, `name`
    /// where they apply), passed to the template as they are.
    pub messages: &'a Value,
    /// The tool declarations (a JSON list of `{"type": "function", "function": {…}}`), if any.
    pub tools: Option<&'a Value>,
    /// Extra template variables (OpenAI-compatible servers' `chat_template_kwargs`, such as
    /// `enable_thinking`); the names above and the special tokens take precedence.
    pub kwargs: Option<&'a serde_json::Map<String, Value>>,
    /// Append the prompt that opens the assistant's turn.
    pub add_generation_prompt: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEMMA3: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}"#;

    fn template(source: &str) -> ChatTemplate {
        ChatTemplate::from_source(source, &[("bos_token", "<bos>"), ("eos_token", "<eos>")], "test template").unwrap()
    }

    #[test]
    fn gemma3_template_renders_as_hugging_face_does() {
        let text = template(GEMMA3).render("  Why is the sky blue?\n").unwrap();
        assert_eq!(text, "<bos><start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n");
    }

    #[test]
    fn python_methods_and_raised_exceptions() {
        let t = template("{{ messages[0]['content'].strip().upper() }}{% if add_generation_prompt %}!{% endif %}");
        assert_eq!(t.render(" hi ").unwrap(), "HI!");
        let e = template("{{ raise_exception('no system role here') }}").render("x").unwrap_err().to_string();
        assert!(e.starts_with("test template: ") && e.contains("no system role here"), "{e}");
    }

    #[test]
    fn conversations_render_every_message() {
        let t = template("{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}");
        let msgs = serde_json::json!([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]);
        assert_eq!(t.render_messages(&msgs, true).unwrap(), "[system:s][user:u]>");
        assert_eq!(t.render_messages(&msgs, false).unwrap(), "[system:s][user:u]");
    }

    #[test]
    fn a_broken_template_fails_when_loaded() {
        let e = ChatTemplate::from_source("{% if %}", &[], "t").unwrap_err();
        assert_eq!(e.origin, "t");
    }
}
