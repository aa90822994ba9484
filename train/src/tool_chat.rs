//! A tool-calling chat checkpoint for tests: a tiny target trained here on conversations in
//! Gemma-4's chat format (turn markers, tool declarations, tool calls in Gemma's argument
//! notation, tool responses, a thinking channel), with a tokenizer whose markers are special
//! tokens and a chat template with the published Gemma-4 template's behaviour (written for this
//! project: system turn with `<|think|>` and `<|tool>` declarations, `model` role, calls and
//! responses inside the model's turn, thought text stripped from history, an empty thought
//! channel opening the reply when thinking is off). It learns a small world by heart:
//! `get_weather` and `get_time` for two cities, and greetings, with and without thinking, so a
//! server test can watch a real model call a tool and answer from its result.

use std::path::{Path, PathBuf};

use gemma4::chat_markup::{format_argument, Markup, QUOTE, TOOL_CALL_END, TOOL_CALL_START};
use gemma4::chat_template::{ChatInput, ChatTemplate};
use gemma4::generate::{generate, GenerateConfig};
use gemma4::tokenizer::{stop_tokens, Tokenizer};
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::target_checkpoint::write_target_checkpoint;
use crate::target_train::{init_params, small_config, train_target, TargetTrainConfig};

/// The markup tokens, special in the tokenizer (ids 3.. in this order).
pub const MARKERS: [&str; 12] = [
    "<|turn>",
    "<turn|>",
    "<|tool>",
    "<tool|>",
    TOOL_CALL_START,
    TOOL_CALL_END,
    "<|tool_response>",
    "<tool_response|>",
    QUOTE,
    "<|channel>",
    "<channel|>",
    "<|think|>",
];

/// The chat template (Jinja, rendered as Hugging Face's `apply_chat_template` does).
pub const TEMPLATE: &str = r#"{%- macro arg(v) -%}
{%- if v is string -%}{{ '<|"|>' + v + '<|"|>' }}
{%- elif v is mapping -%}{{ '{' }}{%- for k, x in v | dictsort -%}{{ k }}:{{ arg(x) }}{{ ',' if not loop.last }}{%- endfor -%}{{ '}' }}
{%- elif v is sequence -%}{{ '[' }}{%- for x in v -%}{{ arg(x) }}{{ ',' if not loop.last }}{%- endfor -%}{{ ']' }}
{%- elif v is true -%}true{%- elif v is false -%}false{%- elif v is none -%}null
{%- else -%}{{ v }}{%- endif -%}
{%- endmacro -%}
{%- macro visible(text) -%}
{%- set ns = namespace(out='') -%}
{%- for part in text.split('<channel|>') -%}{%- set ns.out = ns.out + part.split('<|channel>')[0] -%}{%- endfor -%}
{{- ns.out | trim -}}
{%- endmacro -%}
{{- bos_token -}}
{%- set think = enable_thinking is defined and enable_thinking -%}
{%- set has_system = messages and messages[0]['role'] in ['system', 'developer'] -%}
{%- if think or tools or has_system -%}
{{- '<|turn>system\n' -}}
{%- if think -%}{{- '<|think|>' -}}{%- endif -%}
{%- if has_system -%}{{- messages[0]['content'] | trim -}}{%- endif -%}
{%- for tool in tools or [] -%}
{{- '<|tool>declaration:' + tool['function']['name'] + '{description:' + arg(tool['function']['description'] or '') + ',parameters:' + arg(tool['function']['parameters'] or {}) + '}<tool|>' -}}
{%- endfor -%}
{{- '<turn|>\n' -}}
{%- endif -%}
{%- set ns = namespace(open=false) -%}
{%- for m in (messages[1:] if has_system else messages) -%}
{%- if m['role'] == 'tool' -%}
{{- '<|tool_response>response:' + (m['name'] or 'unknown') + '{value:' + arg(m['content'] or '') + '}<tool_response|>' -}}
{%- else -%}
{%- if not (ns.open and m['role'] == 'assistant') -%}
{%- if ns.open -%}{{- '<turn|>\n' -}}{%- endif -%}
{{- '<|turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' -}}
{%- endif -%}
{%- for call in m['tool_calls'] or [] -%}
{%- set a = call['function']['arguments'] -%}
{{- '<|tool_call>call:' + call['function']['name'] + (a if a is string else arg(a)) + '<tool_call|>' -}}
{%- endfor -%}
{%- if m['content'] is string -%}
{{- visible(m['content']) if m['role'] == 'assistant' else m['content'] | trim -}}
{%- endif -%}
{%- if m['tool_calls'] -%}{%- set ns.open = true -%}{%- else -%}{{- '<turn|>\n' -}}{%- set ns.open = false -%}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{%- if not ns.open -%}{{- '<|turn>model\n' -}}{%- endif -%}
{%- if not think -%}{{- '<|channel>thought\n<channel|>' -}}{%- endif -%}
{%- elif ns.open -%}{{- '<turn|>\n' -}}
{%- endif -%}"#;

/// The cities of the world the fixture learns, with their weather and time.
pub const CITIES: [(&str, &str, &str); 2] =
    [("Paris", "18 degrees and sunny", "14:05"), ("Oslo", "3 degrees and snowing", "09:30")];

/// The people the fixture greets.
pub const NAMES: [&str; 2] = ["Ada", "Linus"];

/// The tools of the fixture's world, as an OpenAI request declares them.
pub fn tools() -> Value {
    let city = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": city}},
        {"type": "function", "function": {"name": "get_time", "description": "Time", "parameters": city}},
    ])
}

/// One training conversation: what the template renders as the prompt, and the reply the
/// model learns (ending with the token that stops it).
pub struct Example {
    /// The request's messages.
    pub messages: Value,
    /// Tool declarations, when the request carries them.
    pub tools: Option<Value>,
    /// `enable_thinking`.
    pub thinking: bool,
    /// The reply's text (markup included), without the stop token.
    pub reply: String,
    /// The token that ends the reply: `<turn|>`, or `<|tool_response>` after a call.
    pub stop: &'static str,
}

/// The whole world, every conversation the fixture learns.
pub fn examples() -> Vec<Example> {
    let mut out = Vec::new();
    let tools = tools();
    for (city, weather, time) in CITIES {
        for (tool, ask, result, answer) in [
            ("get_weather", format!("What is the weather in {city}?"), weather, format!("It is {weather} in {city}.")),
            ("get_time", format!("What time is it in {city}?"), time, format!("It is {time} in {city}.")),
        ] {
            let user = json!({"role": "user", "content": ask});
            let args = json!({"city": city});
            out.push(Example {
                messages: json!([user]),
                tools: Some(tools.clone()),
                thinking: false,
                reply: format!("{TOOL_CALL_START}call:{tool}{}{TOOL_CALL_END}", format_argument(&args)),
                stop: "<|tool_response>",
            });
            let call = json!({"id": "call_1", "type": "function", "function": {"name": tool, "arguments": args}});
            out.push(Example {
                messages: json!([user, {"role": "assistant", "tool_calls": [call]},
                                 {"role": "tool", "tool_call_id": "call_1", "name": tool, "content": result}]),
                tools: Some(tools.clone()),
                thinking: false,
                reply: answer,
                stop: "<turn|>",
            });
        }
    }
    for name in NAMES {
        for with_tools in [false, true] {
            out.push(Example {
                messages: json!([{"role": "user", "content": format!("Say hello to {name}.")}]),
                tools: with_tools.then(|| tools.clone()),
                thinking: false,
                reply: format!("Hello, {name}!"),
                stop: "<turn|>",
            });
        }
    }
    for name in NAMES {
        out.push(Example {
            messages: json!([{"role": "user", "content": format!("Say hello to {name}.")}]),
            tools: None,
            thinking: true,
            reply: format!("<|channel>thought\nGreet {name}.<channel|>Hello, {name}!"),
            stop: "<turn|>",
        });
    }
    out
}

/// The rendered prompt of an example.
pub fn prompt_text(t: &ChatTemplate, e: &Example) -> Result<String> {
    let kwargs: serde_json::Map<String, Value> =
        [("enable_thinking".to_string(), Value::Bool(e.thinking))].into_iter().collect();
    t.render_chat(&ChatInput {
        messages: &e.messages,
        tools: e.tools.as_ref(),
        kwargs: Some(&kwargs),
        add_generation_prompt: true,
    })
    .map_err(|e| Error::Invalid { what: "the fixture's chat template".into(), detail: e.to_string() })
}

/// Trains the fixture and writes it to `out` (replacing what is there): a few seconds of
/// training on two cores. Returns the directory.
pub fn write_tool_chat_checkpoint(out: &Path, steps: u64) -> Result<PathBuf> {
    let template = ChatTemplate::from_source(TEMPLATE, &[("bos_token", "<bos>"), ("eos_token", "<eos>")], "fixture")
        .map_err(|e| Error::Invalid { what: "the fixture's chat template".into(), detail: e.to_string() })?;
    let world = examples();
    let docs: Vec<String> = world
        .iter()
        .map(|e| Ok(format!("{}{}{}", prompt_text(&template, e)?, e.reply, e.stop)))
        .collect::<Result<_>>()?;
    let tk = crate::bpe::train_bpe_with(docs.iter().map(String::as_str), 384, &MARKERS)?;
    let tok_err =
        |e: tokenizers::Error| Error::Invalid { what: "the fixture's tokenizer".into(), detail: e.to_string() };
    let (mut stream, mut longest) = (Vec::new(), 0);
    for (d, e) in docs.iter().zip(&world) {
        // Every document starts with <bos> (the template writes it). Greetings are short and
        // differ only by a name: they are seen three times as often, and the thinking ones,
        // whose thought ("Greet Linus.") competes with the far commoner reply ("Linus!"), six.
        let ids = tk.encode(d.as_str(), false).map_err(tok_err)?;
        longest = longest.max(ids.len());
        let repeats = match (e.thinking, e.reply.contains("Hello, ")) {
            (true, true) => 6,
            (false, true) => 3,
            _ => 1,
        };
        for _ in 0..repeats {
            stream.extend(ids.get_ids());
        }
    }
    let vocab = tk.get_vocab_size(true);
    let mut cfg = small_config(vocab, 64, 2, 2, 512)?;
    let id = |t: &str| {
        tk.token_to_id(t).ok_or_else(|| Error::Invalid { what: t.into(), detail: "not in the vocabulary".into() })
    };
    cfg.eos_token_ids = vec![1, id("<turn|>")?, id("<|tool_response>")?];
    let tc = TargetTrainConfig {
        steps,
        batch: 8,
        seq_len: longest.min(512),
        lr: 1e-2,
        warmup: 20,
        weight_decay: 0.0,
        eval_every: 0,
        eval_windows: 4,
        ..TargetTrainConfig::default()
    };
    let mut report = train_target(&cfg, init_params(&cfg, 3)?, &stream, &stream, &tc, |_| {})?;
    let mut total = steps;
    // Tests need every reply exact, and a reply that is only just ahead of its rival flips with
    // the rounding of the kernels that trained it: train on, a little at a time, until the
    // fixture knows its whole world (or give up after EXTRA_ROUNDS and let the tests say which
    // replies are wrong).
    for round in 0..=EXTRA_ROUNDS {
        let summary = json!({"fixture": "tool-chat", "steps": total, "final_loss": report.losses.last()});
        write_target_checkpoint(out, true, &cfg, &report, (&tk, TEMPLATE), &summary)?;
        if round == EXTRA_ROUNDS || wrong_replies(out)?.is_empty() {
            break;
        }
        let more = TargetTrainConfig { steps: EXTRA_STEPS, warmup: 0, lr: 3e-3, ..tc.clone() };
        report = train_target(&cfg, (report.names.clone(), report.params.clone()), &stream, &stream, &more, |_| {})?;
        total += EXTRA_STEPS;
    }
    Ok(out.to_path_buf())
}

/// Further training rounds after [`STEPS`] while a reply is wrong, and their length.
const EXTRA_ROUNDS: u32 = 6;
const EXTRA_STEPS: u64 = 100;

/// The replies of [`examples`] the checkpoint in `dir` gets wrong under greedy decoding (40
/// tokens at most, the model's stop tokens), as `"expected" -> "got"` lines; empty when it
/// knows its whole world.
pub fn wrong_replies(dir: &Path) -> Result<Vec<String>> {
    let model = gemma4::Model::load(dir)?;
    let invalid = |detail: String| Error::Invalid { what: "the fixture's tokenizer".into(), detail };
    let tok = Tokenizer::from_dir(dir).map_err(|e| invalid(e.to_string()))?;
    let template = ChatTemplate::of(&tok).map_err(|e| invalid(e.to_string()))?;
    let template = template.ok_or_else(|| invalid("no chat template".into()))?;
    let markup = Markup::of(&tok).ok_or_else(|| invalid("the chat markers are not tokens".into()))?;
    let stops = stop_tokens(model.config(), Some(&tok));
    let mut wrong = Vec::new();
    for e in examples() {
        let ids = tok.encode(&prompt_text(&template, &e)?, false).map_err(|e| invalid(e.to_string()))?;
        let cfg = GenerateConfig { max_tokens: 40, stop_tokens: stops.clone(), ..Default::default() };
        let out = generate(&model, &ids, &cfg, |_| {})?;
        let text = tok.decode_keeping(&out.tokens, &markup.kept).map_err(|e| invalid(e.to_string()))?;
        if text != e.reply {
            wrong.push(format!("{:?} -> {text:?}", e.reply));
        }
    }
    Ok(wrong)
}

/// Steps that teach the fixture its whole world (every reply of [`examples`] exact, greedy).
pub const STEPS: u64 = 450;

/// The fixture under `root`, trained once (about a minute on two cores) and reused while its
/// template, world and steps are unchanged (the directory is named by their fingerprint).
pub fn cached_tool_chat_checkpoint(root: &Path) -> Result<PathBuf> {
    // FNV-1a over everything that shapes the checkpoint.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |s: &str| {
        for b in s.bytes().chain([0]) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    };
    feed(TEMPLATE);
    feed(&STEPS.to_string());
    feed(&format!("until exact: {EXTRA_ROUNDS} x {EXTRA_STEPS}; greetings x3, thinking ones x6"));
    for e in examples() {
        feed(&e.messages.to_string());
        feed(&e.reply);
        feed(e.stop);
    }
    let dir = root.join(format!("tool-chat-{h:016x}"));
    if dir.join("tokenizer_config.json").is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(root).map_err(|source| Error::Io { path: root.to_path_buf(), source })?;
    write_tool_chat_checkpoint(&dir, STEPS)
}
