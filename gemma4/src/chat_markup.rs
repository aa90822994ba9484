//! Gemma-4's chat markup in generated text: thinking in a channel
//! (`<|channel>thought\n…<channel|>`) and tool calls (`<|tool_call>call:NAME{ARGS}<tool_call|>`,
//! where ARGS is Gemma's argument notation: `key:value` pairs, strings quoted by `<|"|>`).
//! [`OutputParser`] splits the text a model streams into content, reasoning and tool calls, as an
//! OpenAI-style server returns them. The markers are special tokens, which a plain decode drops:
//! [`Markup::of`] finds their ids so a detokenizer can keep them
//! ([`crate::tokenizer::Tokenizer::decode_keeping`]).

use serde_json::{Map, Value};

use crate::tokenizer::Tokenizer;

/// Opens a tool call.
pub const TOOL_CALL_START: &str = "<|tool_call>";
/// Closes a tool call.
pub const TOOL_CALL_END: &str = "<tool_call|>";
/// Opens a channel (the first line names it: `thought`).
pub const CHANNEL_START: &str = "<|channel>";
/// Closes a channel.
pub const CHANNEL_END: &str = "<channel|>";
/// Quotes a string in the argument notation.
pub const QUOTE: &str = "<|\"|>";

/// The markup tokens of a tokenizer that speaks Gemma-4's chat format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Markup {
    /// Ids of the markers generated text may carry (tool calls, channels, quotes); a
    /// detokenizer keeps their text so [`OutputParser`] can see them.
    pub kept: Vec<u32>,
    /// The id of [`TOOL_CALL_START`].
    pub tool_call_start: u32,
}

impl Markup {
    /// The markup of `tok`, when its vocabulary has the tool-call and channel markers (Gemma-4
    /// chat checkpoints do; a plain text model does not).
    pub fn of(tok: &Tokenizer) -> Option<Markup> {
        let ids: Option<Vec<u32>> = [TOOL_CALL_START, TOOL_CALL_END, CHANNEL_START, CHANNEL_END, QUOTE]
            .iter()
            .map(|t| tok.token_to_id(t))
            .collect();
        let kept = ids?;
        Some(Markup { tool_call_start: kept[0], kept })
    }
}

/// A tool call the model made, with its arguments as JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// The arguments, a JSON object.
    pub arguments: Value,
}

/// What a stretch of generated text is.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// Text for the user (OpenAI's `content`).
    Content(String),
    /// Thinking text (OpenAI-compatible servers' `reasoning_content`).
    Reasoning(String),
    /// A whole tool call.
    ToolCall(ToolCall),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Content,
    /// Inside a channel; `named` once its name line has been read.
    Channel {
        named: bool,
    },
    ToolCall,
}

/// Splits streamed text into [`Part`]s (see the module docs). Text that may be the start of a
/// marker is held back until the next piece decides it.
#[derive(Clone, Debug)]
pub struct OutputParser {
    state: State,
    /// Read tool calls (off: their text is content, as when a request's tools are off).
    tool_calls: bool,
    /// Text not yet classified.
    buf: String,
}

impl Default for OutputParser {
    fn default() -> Self {
        OutputParser::new()
    }
}

impl OutputParser {
    /// A parser at the start of a model turn.
    pub fn new() -> OutputParser {
        OutputParser { state: State::Content, tool_calls: true, buf: String::new() }
    }

    /// A parser that separates thinking but leaves tool-call markup in the content.
    pub fn without_tool_calls() -> OutputParser {
        OutputParser { tool_calls: false, ..OutputParser::new() }
    }

    /// Adds generated text; returns the parts it completes, in order.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Content => {
                    let next = [(TOOL_CALL_START, State::ToolCall), (CHANNEL_START, State::Channel { named: false })]
                        .into_iter()
                        .filter(|(_, s)| self.tool_calls || *s != State::ToolCall)
                        .filter_map(|(m, s)| self.buf.find(m).map(|at| (at, m.len(), s)))
                        .min_by_key(|(at, _, _)| *at);
                    match next {
                        Some((at, len, state)) => {
                            emit(&mut out, Part::Content(self.buf[..at].to_string()));
                            self.buf.drain(..at + len);
                            self.state = state;
                        }
                        None => {
                            let markers: &[&str] =
                                if self.tool_calls { &[TOOL_CALL_START, CHANNEL_START] } else { &[CHANNEL_START] };
                            let keep = held_back(&self.buf, markers);
                            let ready = self.buf.len() - keep;
                            emit(&mut out, Part::Content(self.buf[..ready].to_string()));
                            self.buf.drain(..ready);
                            return out;
                        }
                    }
                }
                State::Channel { named: false } => {
                    // The channel's name (`thought`) is markup, not reasoning: it runs to the
                    // first newline, or to the channel's end when that comes first.
                    let newline = self.buf.find('\n');
                    let end = self.buf.find(CHANNEL_END);
                    match (newline, end) {
                        (Some(n), Some(e)) if e < n => {
                            self.buf.drain(..e);
                        }
                        (Some(n), _) => {
                            self.buf.drain(..=n);
                        }
                        (None, Some(e)) => {
                            self.buf.drain(..e);
                        }
                        // A name still arriving (a partial end marker stays in the buffer).
                        (None, None) => return out,
                    }
                    self.state = State::Channel { named: true };
                }
                State::Channel { named: true } => match self.buf.find(CHANNEL_END) {
                    Some(at) => {
                        emit(&mut out, Part::Reasoning(self.buf[..at].to_string()));
                        self.buf.drain(..at + CHANNEL_END.len());
                        self.state = State::Content;
                    }
                    None => {
                        let ready = self.buf.len() - held_back(&self.buf, &[CHANNEL_END]);
                        emit(&mut out, Part::Reasoning(self.buf[..ready].to_string()));
                        self.buf.drain(..ready);
                        return out;
                    }
                },
                State::ToolCall => match self.buf.find(TOOL_CALL_END) {
                    Some(at) => {
                        let body = self.buf[..at].to_string();
                        self.buf.drain(..at + TOOL_CALL_END.len());
                        self.state = State::Content;
                        match parse_call(&body) {
                            Some(call) => out.push(Part::ToolCall(call)),
                            // Not a call the notation describes: the text stays visible.
                            None => emit(&mut out, Part::Content(format!("{TOOL_CALL_START}{body}{TOOL_CALL_END}"))),
                        }
                    }
                    None => return out,
                },
            }
        }
    }

    /// Ends the text: what was held back is released (an unfinished tool call as the content
    /// it was, so nothing generated is lost).
    pub fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.buf);
        let mut out = Vec::new();
        match self.state {
            State::Content => emit(&mut out, Part::Content(rest)),
            State::Channel { .. } => emit(&mut out, Part::Reasoning(rest)),
            State::ToolCall => emit(&mut out, Part::Content(format!("{TOOL_CALL_START}{rest}"))),
        }
        self.state = State::Content;
        out
    }

    /// The parts of a whole text.
    pub fn parse(text: &str) -> Vec<Part> {
        OutputParser::new().read_to_end(text)
    }

    /// The parts of the rest of a text, `text`, after what this parser has already read.
    pub fn read_to_end(mut self, text: &str) -> Vec<Part> {
        let mut parts = self.push(text);
        for part in self.finish() {
            emit(&mut parts, part);
        }
        parts
    }
}

/// Appends a part, merging it into the previous one of the same text kind; empty text adds
/// nothing.
fn emit(out: &mut Vec<Part>, part: Part) {
    match (out.last_mut(), part) {
        (_, Part::Content(s) | Part::Reasoning(s)) if s.is_empty() => {}
        (Some(Part::Content(a)), Part::Content(b)) => a.push_str(&b),
        (Some(Part::Reasoning(a)), Part::Reasoning(b)) => a.push_str(&b),
        (_, p) => out.push(p),
    }
}

/// Bytes at the end of `text` that could be the start of one of `markers`: the longest suffix
/// that is a proper prefix of one. A stream holds them back until the next piece decides
/// (this parser's markers, a detokenizer's stop strings).
pub fn held_back<S: AsRef<str>>(text: &str, markers: &[S]) -> usize {
    let mut best = 0;
    for m in markers {
        let m = m.as_ref();
        for (i, _) in m.char_indices().skip(1) {
            if i > best && text.ends_with(&m[..i]) {
                best = i;
            }
        }
    }
    best
}

/// `call:NAME{ARGS}` to a tool call.
fn parse_call(body: &str) -> Option<ToolCall> {
    let rest = body.trim().strip_prefix("call:")?;
    let open = rest.find('{')?;
    let name = rest[..open].trim();
    if name.is_empty() {
        return None;
    }
    let mut r = Reader { s: &rest[open..] };
    let arguments = r.object()?;
    r.s.trim().is_empty().then(|| ToolCall { name: name.to_string(), arguments })
}

/// A cursor over the argument notation.
struct Reader<'a> {
    s: &'a str,
}

impl Reader<'_> {
    fn eat(&mut self, t: &str) -> bool {
        self.s = self.s.trim_start();
        match self.s.strip_prefix(t) {
            Some(rest) => {
                self.s = rest;
                true
            }
            None => false,
        }
    }

    fn value(&mut self) -> Option<Value> {
        self.s = self.s.trim_start();
        if self.s.starts_with(QUOTE) {
            return self.string().map(Value::String);
        }
        if self.s.starts_with('{') {
            return self.object();
        }
        if self.eat("[") {
            let mut items = Vec::new();
            if self.eat("]") {
                return Some(Value::Array(items));
            }
            loop {
                items.push(self.value()?);
                if self.eat("]") {
                    return Some(Value::Array(items));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        // A bare scalar: a number, true, false or null, up to the next delimiter.
        let end = self.s.find([',', '}', ']']).unwrap_or(self.s.len());
        let word = self.s[..end].trim();
        self.s = &self.s[end..];
        match serde_json::from_str::<Value>(word) {
            Ok(v @ (Value::Number(_) | Value::Bool(_) | Value::Null)) => Some(v),
            // Gemma quotes strings; an unquoted word is kept as the string it reads as.
            _ if !word.is_empty() => Some(Value::String(word.to_string())),
            _ => None,
        }
    }

    fn string(&mut self) -> Option<String> {
        let inner = self.s.strip_prefix(QUOTE)?;
        let end = inner.find(QUOTE)?;
        let text = inner[..end].to_string();
        self.s = &inner[end + QUOTE.len()..];
        Some(text)
    }

    /// `{key:value,…}`; keys bare (as Gemma writes a call's) or quoted.
    fn object(&mut self) -> Option<Value> {
        if !self.eat("{") {
            return None;
        }
        let mut map = Map::new();
        if self.eat("}") {
            return Some(Value::Object(map));
        }
        loop {
            self.s = self.s.trim_start();
            let key = if self.s.starts_with(QUOTE) {
                self.string()?
            } else {
                let end = self.s.find(':')?;
                let k = self.s[..end].trim().to_string();
                self.s = &self.s[end..];
                k
            };
            if key.is_empty() || !self.eat(":") {
                return None;
            }
            let v = self.value()?;
            map.insert(key, v);
            if self.eat("}") {
                return Some(Value::Object(map));
            }
            if !self.eat(",") {
                return None;
            }
        }
    }
}

/// Gemma's argument notation of a JSON value (the inverse of the parser, for prompts and
/// tests): strings quoted with [`QUOTE`], object keys bare and sorted.
pub fn format_argument(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{QUOTE}{s}{QUOTE}"),
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let inner: Vec<String> = keys.iter().map(|k| format!("{k}:{}", format_argument(&m[*k]))).collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(format_argument).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, arguments: Value) -> Part {
        Part::ToolCall(ToolCall { name: name.into(), arguments })
    }

    #[test]
    fn splits_content_reasoning_and_calls() {
        let text = "<|channel>thought\nNeed the weather.<channel|>Checking.<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3}<tool_call|>";
        assert_eq!(
            OutputParser::parse(text),
            vec![
                Part::Reasoning("Need the weather.".into()),
                Part::Content("Checking.".into()),
                call("get_weather", json!({"city": "Paris", "days": 3})),
            ]
        );
    }

    #[test]
    fn every_split_of_the_stream_gives_the_same_parts() {
        let text = "Hi <|channel>thought\nhm<channel|>ok<|tool_call>call:f{a:[1,<|\"|>x,y<|\"|>],b:{<|\"|>k<|\"|>:true},c:null}<tool_call|><|tool_call>call:g{ x: { y: <|\"|>z<|\"|> } }<tool_call|> end <|channel>thought<channel|>A:\nb <|";
        let whole = OutputParser::parse(text);
        assert_eq!(
            whole,
            vec![
                Part::Content("Hi ".into()),
                Part::Reasoning("hm".into()),
                Part::Content("ok".into()),
                call("f", json!({"a": [1, "x,y"], "b": {"k": true}, "c": null})),
                call("g", json!({"x": {"y": "z"}})),
                // A channel with a name and no text adds nothing; its end is found before
                // the newline that follows it.
                Part::Content(" end A:\nb <|".into()),
            ]
        );
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        for step in 1..=7 {
            let mut p = OutputParser::new();
            let mut parts = Vec::new();
            for chunk in chars.chunks(step) {
                let (a, _) = chunk[0];
                let b = chunk.last().map_or(a, |(i, c)| i + c.len_utf8());
                for part in p.push(&text[a..b]) {
                    emit(&mut parts, part);
                }
            }
            for part in p.finish() {
                emit(&mut parts, part);
            }
            assert_eq!(parts, whole, "pieces of {step} chars");
        }
    }

    #[test]
    fn malformed_or_unfinished_calls_stay_visible() {
        let bad = "<|tool_call>call:{x:1}<tool_call|>";
        assert_eq!(OutputParser::parse(bad), vec![Part::Content(bad.into())]);
        let cut = "<|tool_call>call:f{a:<|\"|>Par";
        assert_eq!(OutputParser::parse(cut), vec![Part::Content(cut.into())]);
        assert_eq!(OutputParser::parse("a<|chan"), vec![Part::Content("a<|chan".into())]);
    }

    #[test]
    fn tool_calls_can_be_left_as_text() {
        let text = "<|channel>thought\nx<channel|>a<|tool_call>call:f{}<tool_call|>";
        assert_eq!(
            OutputParser::without_tool_calls().read_to_end(text),
            vec![Part::Reasoning("x".into()), Part::Content("a<|tool_call>call:f{}<tool_call|>".into())]
        );
    }

    #[test]
    fn the_notation_round_trips() {
        let v = json!({"city": "Paris", "n": 2, "tags": ["a", "b"], "opts": {"deep": false}});
        let text = format!("{TOOL_CALL_START}call:f{}{TOOL_CALL_END}", format_argument(&v));
        assert_eq!(OutputParser::parse(&text), vec![call("f", v)]);
    }
}
