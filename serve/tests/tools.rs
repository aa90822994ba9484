//! Tool calling and thinking through the Gemma-4 chat format, on a checkpoint trained here
//! for it (`train::tool_chat`): tools, `tool_choice`, assistant `tool_calls` and `tool`
//! results reach the template; calls come back parsed (whole and streamed), thinking as
//! `reasoning_content`, `finish_reason: "tool_calls"`.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use axum::http::StatusCode;
use axum::Router;
use gemma4::chat_template::{ChatInput, ChatTemplate};
use gemma4::tokenizer::Tokenizer;
use serde_json::{json, Value};
use serve::{router, Engine, EngineConfig, RouterConfig};

use common::frames;

fn fixture() -> &'static PathBuf {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        train::tool_chat::cached_tool_chat_checkpoint(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")))
            .expect("the tool-chat fixture")
    })
}

fn app() -> &'static Router {
    static A: OnceLock<Router> = OnceLock::new();
    A.get_or_init(|| {
        let engine = Engine::start(EngineConfig::new(fixture().clone(), "tool-chat".into())).expect("engine");
        router(Arc::new(engine), RouterConfig::default())
    })
}

async fn post(body: &Value) -> (StatusCode, Value) {
    common::post(app(), "/v1/chat/completions", body).await
}

fn ask(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

fn weather_call() -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]})
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_call_comes_back_parsed() {
    let (s, v) = post(&json!({"messages": ask("What is the weather in Paris?"), "tools": train::tool_chat::tools(), "temperature": 0})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let msg = &choice["message"];
    assert!(msg["content"].is_null(), "{v}");
    let call = &msg["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{v}");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    assert_eq!(msg["tool_calls"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_streamed_tool_call_is_one_delta_and_ends_with_tool_calls() {
    let body = json!({"messages": ask("What time is it in Oslo?"), "tools": train::tool_chat::tools(),
                      "temperature": 0, "stream": true, "stream_options": {"include_usage": true}});
    let (s, v) = post(&body).await;
    assert_eq!(s, StatusCode::OK);
    let chunks = frames(&v);
    let calls: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
    assert_eq!(calls.len(), 1, "{chunks:#?}");
    let call = &calls[0][0];
    assert_eq!((call["index"].as_u64(), call["function"]["name"].as_str()), (Some(0), Some("get_time")));
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Oslo"}));
    let content: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
    assert_eq!(content, "", "no markup leaks into content");
    let finish: Vec<&str> = chunks.iter().filter_map(|c| c["choices"][0]["finish_reason"].as_str()).collect();
    assert_eq!(finish, ["tool_calls"]);
    assert_eq!(chunks.iter().filter(|c| !c["usage"].is_null()).count(), 1, "usage once");
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_results_are_rendered_and_answered() {
    let messages = json!([ask("What is the weather in Paris?")[0], weather_call(), {"role": "tool", "tool_call_id": "call_7", "content": "18 degrees and sunny"}]);
    let (s, v) = post(&json!({"messages": messages, "tools": train::tool_chat::tools(), "temperature": 0})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "It is 18 degrees and sunny in Paris.", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());
    // Every message reached the template: the prompt is the template's whole rendering (the
    // call in Gemma's notation, the result named after the call it answers).
    let tok = Tokenizer::from_dir(fixture()).unwrap();
    let template = ChatTemplate::of(&tok).unwrap().unwrap();
    let rendered = json!([ask("What is the weather in Paris?")[0],
        {"role": "assistant", "tool_calls": [{"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_7", "name": "get_weather", "content": "18 degrees and sunny"}]);
    let tools = train::tool_chat::tools();
    let text = template
        .render_chat(&ChatInput { messages: &rendered, tools: Some(&tools), kwargs: None, add_generation_prompt: true })
        .unwrap();
    assert!(text.contains("<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|><|tool_response>response:get_weather{value:<|\"|>18 degrees and sunny<|\"|>}"), "{text}");
    let expected = tok.encode(&text, false).unwrap().len();
    assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(expected as u64));
}

#[tokio::test(flavor = "multi_thread")]
async fn thinking_comes_back_as_reasoning_content() {
    let body = json!({"messages": ask("Say hello to Ada."), "temperature": 0, "chat_template_kwargs": {"enable_thinking": true}});
    let (s, v) = post(&body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let msg = &v["choices"][0]["message"];
    assert_eq!(
        (msg["reasoning_content"].as_str(), msg["content"].as_str()),
        (Some("Greet Ada."), Some("Hello, Ada!")),
        "{v}"
    );
    let (_, streamed) = post(&json!({"messages": ask("Say hello to Ada."), "temperature": 0, "stream": true,
                                    "chat_template_kwargs": {"enable_thinking": true}}))
    .await;
    let chunks = frames(&streamed);
    let field = |name: &str| -> String {
        chunks.iter().filter_map(|c| c["choices"][0]["delta"][name].as_str()).collect::<Vec<_>>().concat()
    };
    assert_eq!((field("reasoning_content"), field("content")), ("Greet Ada.".to_string(), "Hello, Ada!".to_string()));
    // Thinking off (the default): no reasoning.
    let (_, v) = post(&json!({"messages": ask("Say hello to Ada."), "temperature": 0})).await;
    assert_eq!(v["choices"][0]["message"]["content"], "Hello, Ada!", "{v}");
    assert!(v["choices"][0]["message"].get("reasoning_content").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_choice_none_required_and_named() {
    let tools = train::tool_chat::tools();
    let (_, v) =
        post(&json!({"messages": ask("Say hello to Ada."), "tools": tools, "tool_choice": "none", "temperature": 0}))
            .await;
    assert_eq!(v["choices"][0]["message"]["content"], "Hello, Ada!", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // Named: the reply is made to start with a call of that function.
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    let (_, v) = post(
        &json!({"messages": ask("What time is it in Paris?"), "tools": tools, "tool_choice": named, "temperature": 0}),
    )
    .await;
    let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_time", "{v}");
    assert_eq!(serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).unwrap(), json!({"city": "Paris"}));
    // Required: the reply starts with a call.
    let (_, v) = post(&json!({"messages": ask("What is the weather in Oslo?"), "tools": tools, "tool_choice": "required", "temperature": 0})).await;
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    assert_eq!(v["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather", "{v}");
    // Even where the model would have answered in text: this toy model then writes no
    // well-formed call, and the unparsed text it wrote stays visible, forced opening included.
    let (_, v) = post(&json!({"messages": ask("Say hello to Ada."), "tools": tools, "tool_choice": "required", "temperature": 0, "max_tokens": 12})).await;
    let content = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
    assert!(content.starts_with("<|tool_call>call:"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_tool_requests_name_the_field() {
    let tools = train::tool_chat::tools();
    let user = ask("hi");
    for (body, param) in [
        (json!({"messages": user, "tool_choice": "auto"}), "tool_choice"),
        (
            json!({"messages": user, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"messages": user, "tools": tools, "tool_choice": "sometimes"}), "tool_choice"),
        (json!({"messages": user, "tools": [{"type": "retrieval"}]}), "tools[0]"),
        (
            json!({"messages": user, "tools": [{"type": "function", "function": {"name": "has space"}}]}),
            "tools[0].function.name",
        ),
        (json!({"messages": user, "tools": "get_weather"}), "tools"),
        (
            json!({"messages": [user[0], {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]}),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (json!({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}), "messages[0].tool_calls"),
        (json!({"messages": user, "chat_template_kwargs": {"messages": []}}), "chat_template_kwargs"),
    ] {
        let (s, v) = post(&body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
    }
    // A model whose tokenizer has no tool-call markup cannot take tools.
    let plain = router(Arc::new(common::engine(false, 1)), RouterConfig::default());
    let (s, v) = common::post(&plain, "/v1/chat/completions", &json!({"messages": user, "tools": tools})).await;
    assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("tools")), "{v}");
}
