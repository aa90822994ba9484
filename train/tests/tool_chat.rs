//! The tool-calling chat fixture learns its whole world: every reply of `examples()` comes back
//! exact under greedy decoding, tool calls parse, and the fixture is cached (shared with the
//! server's tests and the serve gate under target/tmp).

use gemma4::chat_markup::{Markup, OutputParser, Part, ToolCall};
use gemma4::chat_template::ChatTemplate;
use gemma4::generate::{generate, GenerateConfig};
use gemma4::tokenizer::{stop_tokens, Tokenizer};
use serde_json::json;
use train::tool_chat::{cached_tool_chat_checkpoint, examples, prompt_text};

#[test]
fn the_fixture_calls_tools_and_answers_from_their_results() {
    let t0 = std::time::Instant::now();
    let dir = cached_tool_chat_checkpoint(std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))).unwrap();
    eprintln!("trained in {:.1} s", t0.elapsed().as_secs_f64());
    let model = gemma4::Model::load(&dir).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let template = ChatTemplate::of(&tok).unwrap().unwrap();
    let markup = Markup::of(&tok).expect("markers are tokens");
    let stops = stop_tokens(model.config(), Some(&tok));
    let mut wrong = Vec::new();
    let all = examples();
    for e in &all {
        let ids = tok.encode(&prompt_text(&template, e).unwrap(), false).unwrap();
        let cfg = GenerateConfig { max_tokens: 40, stop_tokens: stops.clone(), ..Default::default() };
        let out = generate(&model, &ids, &cfg, |_| {}).unwrap();
        let text = tok.decode_keeping(&out.tokens, &markup.kept).unwrap();
        if text != e.reply {
            wrong.push(format!("{:?} -> {text:?}", e.reply));
        }
    }
    assert!(wrong.is_empty(), "{} of {} replies wrong: {wrong:#?}", wrong.len(), all.len());
    let call = OutputParser::parse(&all[0].reply);
    assert_eq!(
        call,
        vec![Part::ToolCall(ToolCall { name: "get_weather".into(), arguments: json!({"city": "Paris"}) })]
    );
}
