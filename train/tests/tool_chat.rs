//! The tool-calling chat fixture learns its whole world: every reply of `examples()` comes back
//! exact under greedy decoding, tool calls parse, and the fixture is cached (shared with the
//! server's tests and the serve gate under target/tmp).

use gemma4::chat_markup::{OutputParser, Part, ToolCall};
use serde_json::json;
use train::tool_chat::{cached_tool_chat_checkpoint, examples, wrong_replies};

#[test]
fn the_fixture_calls_tools_and_answers_from_their_results() {
    let t0 = std::time::Instant::now();
    let dir = cached_tool_chat_checkpoint(std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))).unwrap();
    eprintln!("trained in {:.1} s", t0.elapsed().as_secs_f64());
    let wrong = wrong_replies(&dir).unwrap();
    let all = examples();
    assert!(wrong.is_empty(), "{} of {} replies wrong: {wrong:#?}", wrong.len(), all.len());
    let call = OutputParser::parse(&all[0].reply);
    assert_eq!(
        call,
        vec![Part::ToolCall(ToolCall { name: "get_weather".into(), arguments: json!({"city": "Paris"}) })]
    );
}
