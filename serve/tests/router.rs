//! The HTTP routes through tower's `oneshot`: refusals of bad input (each a 400 naming the
//! field), the response shapes, streaming, stop strings, cancellation and internal failures.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use axum::Router;
use gemma4::tokenizer::Tokenizer;
use gemma4::Model;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use serve::{router, Engine, EngineConfig, RouterConfig};
use tower::ServiceExt;

use common::{drafter_dir, engine, target_dir};

const LIMIT: usize = 64 * 1024;

fn app(engine: Engine) -> (Router, Arc<Engine>) {
    let e = Arc::new(engine);
    (router(Arc::clone(&e), RouterConfig::new(LIMIT)), e)
}

async fn call(app: &Router, method: &str, path: &str, body: impl Into<Body>) -> (StatusCode, Vec<u8>) {
    let req = HttpRequest::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    (status, resp.into_body().collect().await.unwrap().to_bytes().to_vec())
}

async fn post(app: &Router, path: &str, body: &Value) -> (StatusCode, Value) {
    let (s, b) = call(app, "POST", path, body.to_string()).await;
    (s, serde_json::from_slice(&b).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&b).into())))
}

/// The `data:` payloads of an SSE body; the last must be `[DONE]`.
fn sse_frames(body: &[u8]) -> Vec<Value> {
    let text = String::from_utf8(body.to_vec()).unwrap();
    let datas: Vec<&str> = text.split("\n\n").filter_map(|f| f.trim().strip_prefix("data: ")).collect();
    assert_eq!(datas.last(), Some(&"[DONE]"), "{text}");
    datas[..datas.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect()
}

/// Text of a streamed completion or chat response, and its last chunk.
fn streamed_text(frames: &[Value]) -> (String, Value) {
    let mut text = String::new();
    for f in frames {
        let c = &f["choices"][0];
        if let Some(t) = c["text"].as_str() {
            text.push_str(t);
        }
        if let Some(t) = c["delta"]["content"].as_str() {
            text.push_str(t);
        }
    }
    let last = frames.iter().rev().find(|f| !f["choices"][0]["finish_reason"].is_null()).unwrap().clone();
    (text, last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_400_naming_the_field_and_the_server_keeps_serving() {
    let (app, _e) = app(engine(true, 2));
    let long_prompt = "t5 ".repeat(4200);
    let c = "/v1/completions";
    let ch = "/v1/chat/completions";
    let raw: Vec<(&str, String, Option<&str>)> =
        vec![(c, "{bad".into(), None), (c, "[1, 2]".into(), None), (c, "".into(), None)];
    let cases: Vec<(&str, Value, &str)> = vec![
        (c, json!({"model": 5, "prompt": "t5"}), "model"),
        (c, json!({"prompt": "t5", "temperature": -0.5}), "temperature"),
        (c, json!({"prompt": "t5", "temperature": "hot"}), "temperature"),
        // Finite, positive, and still unusable: 1/T leaves f32's range (infinite or zero).
        (c, json!({"prompt": "t5", "temperature": 1e308}), "temperature"),
        (c, json!({"prompt": "t5", "temperature": 1e-300}), "temperature"),
        (c, json!({"prompt": "t5", "temperature": 1e-45}), "temperature"),
        (c, json!({"prompt": "t5", "top_p": 0}), "top_p"),
        (c, json!({"prompt": "t5", "top_p": 1.5}), "top_p"),
        (c, json!({"prompt": "t5", "max_tokens": 0}), "max_tokens"),
        (c, json!({"prompt": "t5", "max_tokens": 100000}), "max_tokens"),
        (c, json!({"prompt": "t5", "max_tokens": 2.5}), "max_tokens"),
        (c, json!({"max_tokens": 4}), "prompt"),
        (c, json!({"prompt": 5}), "prompt"),
        (c, json!({"prompt": []}), "prompt"),
        (c, json!({"prompt": [999999]}), "prompt"),
        (c, json!({"prompt": ["t5", "t6"]}), "prompt"),
        (c, json!({"prompt": long_prompt}), "prompt"),
        (c, json!({"prompt": "t5", "n": 2}), "n"),
        (c, json!({"prompt": "t5", "stop": 5}), "stop"),
        (c, json!({"prompt": "t5", "stop": [""]}), "stop"),
        (c, json!({"prompt": "t5", "min_p": 2}), "min_p"),
        (c, json!({"prompt": "t5", "top_k": -5}), "top_k"),
        (c, json!({"prompt": "t5", "top_k": 100000}), "top_k"),
        (c, json!({"prompt": "t5", "seed": -1}), "seed"),
        (c, json!({"prompt": "t5", "stream": "yes"}), "stream"),
        (c, json!({"prompt": "t5", "logprobs": 5}), "logprobs"),
        (c, json!({"prompt": "t5", "presence_penalty": 1}), "presence_penalty"),
        (c, json!({"prompt": "t5", "stream_options": 3}), "stream_options"),
        (ch, json!({"max_tokens": 4}), "messages"),
        (ch, json!({"messages": []}), "messages"),
        (ch, json!({"messages": "hi"}), "messages"),
        (ch, json!({"messages": [{"role": "wizard", "content": "t5"}]}), "messages[0].role"),
        (ch, json!({"messages": [{"role": "user", "content": 5}]}), "messages[0].content"),
        (
            ch,
            json!({"messages": [{"role": "user", "content": "t5"}], "max_completion_tokens": 0}),
            "max_completion_tokens",
        ),
    ];
    let mut refused = 0;
    for (path, body, param) in raw {
        let (s, b) = call(&app, "POST", path, body.clone()).await;
        let v: Value = serde_json::from_slice(&b).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&b)));
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(v["error"]["param"].as_str(), param, "{v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.len() > 10), "{v}");
        assert!(v["error"].get("code").is_some(), "{v}");
        refused += 1;
    }
    for (path, body, param) in cases {
        let (s, v) = post(&app, path, &body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body} -> {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(v["error"]["param"], param, "{body} -> {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(param), "the message names the field: {msg}");
        refused += 1;
    }
    assert!(refused >= 20);
    let (s, v) = post(&app, c, &json!({"prompt": "t5 t6", "max_tokens": 3, "temperature": 0})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let (s, _) = call(&app, "GET", "/health", Body::empty()).await;
    assert_eq!(s, StatusCode::OK);
}

/// The text `dspark generate` would print: a session run to the end on this thread.
fn reference_text(prompt: &str, chat: bool, body: &Value) -> String {
    let m = Model::load(target_dir()).unwrap();
    let tok = Tokenizer::from_dir(target_dir()).unwrap();
    let template = gemma4::chat_template::ChatTemplate::of(&tok).unwrap();
    let ids = if chat {
        serve::chat::chat_ids(&tok, template.as_ref(), &serve::chat::user_message(prompt)).unwrap()
    } else {
        serve::chat::text_ids(&tok, prompt).unwrap()
    };
    let mut d = spec_decode::load_drafter(drafter_dir(), m.config()).unwrap();
    let req = serve::Request {
        prompt: ids,
        generate: gemma4::generate::GenerateConfig {
            max_tokens: body["max_tokens"].as_u64().unwrap() as usize,
            sampler: gemma4::sampling::SamplerConfig {
                temperature: body["temperature"].as_f64().unwrap(),
                top_p: body.get("top_p").and_then(Value::as_f64).unwrap_or(1.0),
                top_k: 0,
                min_p: 0.0,
                min_tokens_to_keep: 1,
                logit_bias: vec![],
            },
            seed: body["seed"].as_u64().unwrap_or(0),
            prefill_step: 2048,
            stop_tokens: gemma4::tokenizer::stop_tokens(m.config(), Some(&tok)),
        },
        stop: body
            .get("stop")
            .and_then(Value::as_array)
            .map_or(vec![], |a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect()),
        gamma: None,
        pruning: spec_decode::Pruning::Off,
        kept_tokens: vec![],
        seeded: true,
        adaptive: false,
    };
    let s = serve::Session::start(&m, Some(d.as_mut()), &req, Some(&tok), None).unwrap();
    s.run(Some(d.as_mut()), |_| {}).unwrap().text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_and_whole_responses_carry_the_reference_text() {
    let (app, _e) = app(engine(true, 2));
    let prompt = "t5 t6 t7 t8 t9";
    for params in [
        json!({"max_tokens": 20, "temperature": 0.0}),
        json!({"max_tokens": 20, "temperature": 0.9, "top_p": 0.95, "seed": 7}),
    ] {
        for chat in [false, true] {
            let want = tokio::task::spawn_blocking({
                let params = params.clone();
                move || reference_text(prompt, chat, &params)
            })
            .await
            .unwrap();
            let (path, mut body) = if chat {
                ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": prompt}]}))
            } else {
                ("/v1/completions", json!({"prompt": prompt}))
            };
            for (k, v) in params.as_object().unwrap() {
                body[k] = v.clone();
            }
            let (s, whole) = post(&app, path, &body).await;
            assert_eq!(s, StatusCode::OK, "{whole}");
            let text = if chat {
                assert_eq!(whole["object"], "chat.completion");
                assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
                whole["choices"][0]["message"]["content"].as_str().unwrap().to_string()
            } else {
                assert_eq!(whole["object"], "text_completion");
                whole["choices"][0]["text"].as_str().unwrap().to_string()
            };
            assert_eq!(text, want, "{path} {params}");
            let u = &whole["usage"];
            assert_eq!(u["completion_tokens"], 20, "{u}");
            assert_eq!(u["total_tokens"].as_u64(), Some(u["prompt_tokens"].as_u64().unwrap() + 20));
            let sp = &u["speculation"];
            for k in ["drafted", "accepted", "rounds", "tau", "acceptance_by_position"] {
                assert!(!sp[k].is_null(), "usage.speculation.{k}: {u}");
            }
            assert!(sp["rounds"].as_u64().unwrap() > 0);

            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
            let (s, raw) = call(&app, "POST", path, body.to_string()).await;
            assert_eq!(s, StatusCode::OK);
            let frames = sse_frames(&raw);
            let (streamed, last) = streamed_text(&frames);
            assert_eq!(streamed, want, "streamed {path} {params}");
            assert_eq!(last["choices"][0]["finish_reason"], "length");
            let usage_chunk = frames.last().unwrap();
            assert_eq!(usage_chunk["choices"], json!([]));
            assert_eq!(usage_chunk["usage"]["completion_tokens"], 20);
            // Every chunk but the usage one carries a piece (chat: the first, the role).
            assert!(frames.len() >= 3);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_end_the_text_before_the_match() {
    let (app, _e) = app(engine(true, 2));
    let body = json!({"prompt": "t5 t6 t7", "max_tokens": 16, "temperature": 0});
    let (_, whole) = post(&app, "/v1/completions", &body).await;
    let full = whole["choices"][0]["text"].as_str().unwrap().to_string();
    let words: Vec<&str> = full.split(' ').collect();
    assert!(words.len() >= 4, "{full}");
    // A stop string spanning a token boundary.
    let stop = format!("{} {}", words[2], &words[3][..2]);
    let at = full.find(&stop).unwrap();
    for stream in [false, true] {
        let mut b = body.clone();
        b["stop"] = json!([stop.clone(), "never-there"]);
        b["stream"] = json!(stream);
        let (s, raw) = call(&app, "POST", "/v1/completions", b.to_string()).await;
        assert_eq!(s, StatusCode::OK);
        let (text, finish) = if stream {
            let (t, last) = streamed_text(&sse_frames(&raw));
            (t, last["choices"][0]["finish_reason"].clone())
        } else {
            let v: Value = serde_json::from_slice(&raw).unwrap();
            (v["choices"][0]["text"].as_str().unwrap().to_string(), v["choices"][0]["finish_reason"].clone())
        };
        assert_eq!(text, full[..at], "stream {stream}");
        assert_eq!(finish, "stop");
    }
}

async fn health(app: &Router) -> Value {
    let (s, b) = call(app, "GET", "/health", Body::empty()).await;
    assert_eq!(s, StatusCode::OK);
    serde_json::from_slice(&b).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_cancels_its_generation() {
    let (app, e) = app(engine(true, 1));
    // Long enough that finishing it would take far longer than the wait below.
    let body = json!({"prompt": "t5 t6", "max_tokens": 4000, "temperature": 0, "stream": true});
    let req = HttpRequest::builder().method("POST").uri("/v1/completions").body(Body::from(body.to_string())).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut b = resp.into_body();
    let first = b.frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some_and(|d| d.starts_with(b"data: ")));
    let t0 = Instant::now();
    drop(b);
    let n = e.counters();
    while n.cancelled.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "not cancelled: {:?}", n.snapshot());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let h = health(&app).await;
    assert_eq!(h["requests"]["active"], 0, "{h}");
    assert_eq!(h["requests"]["completed"], 0, "{h}");
    // The single session slot is free again.
    let (s, v) = post(&app, "/v1/completions", &json!({"prompt": "t5", "max_tokens": 2})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_internal_failure_answers_500_and_the_server_goes_on() {
    let mut cfg = EngineConfig::new(target_dir().clone(), "tiny".into());
    cfg.drafter_dir = Some(drafter_dir().clone());
    cfg.panic_on_token = Some(13);
    let (app, _e) = app(Engine::start(cfg).unwrap());
    for stream in [false, true] {
        let (s, v) =
            post(&app, "/v1/completions", &json!({"prompt": [4, 13, 5], "max_tokens": 3, "stream": stream})).await;
        assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
        assert_eq!(v["error"]["type"], "server_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("injected fault"), "{v}");
    }
    let (s, v) = post(&app, "/v1/completions", &json!({"prompt": [4, 12, 5], "max_tokens": 3})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let h = health(&app).await;
    assert_eq!(h["requests"]["failed"], 2, "{h}");
    assert_eq!(h["requests"]["completed"], 1, "{h}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_and_unknown_routes() {
    let (app, _e) = app(engine(false, 1));
    let (s, b) = call(&app, "GET", "/v1/models", Body::empty()).await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["data"][0]["id"], "tiny");
    assert_eq!(health(&app).await["status"], "ok");
    let (s, b) = call(&app, "GET", "/v2/nothing", Body::empty()).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert!(v["error"]["message"].is_string());
    // A plain engine answers without speculation stats, and a repeated prompt hits the cache.
    let body = json!({"prompt": "t5 t6 t7", "max_tokens": 4, "temperature": 0});
    let (_, a) = post(&app, "/v1/completions", &body).await;
    let (_, b) = post(&app, "/v1/completions", &body).await;
    assert!(a["usage"].get("speculation").is_none(), "{a}");
    assert_eq!(a["choices"], b["choices"]);
    assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], 2, "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_renders_the_tokenizers_chat_template() {
    // A copy of the target whose tokenizer_config.json carries a chat template.
    let dir = gemma4::testing::copy_of(target_dir(), "serve-chat-template").unwrap();
    let cfg_path = dir.join("tokenizer_config.json");
    let mut tc: Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    tc["chat_template"] = json!(
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('system messages are not supported') }}{% endif %}\
         {{ bos_token }}{% for m in messages %}{{ m['content'] }} t9 {% endfor %}{% if add_generation_prompt %}t10{% endif %}"
    );
    std::fs::write(&cfg_path, tc.to_string()).unwrap();
    let mut cfg = EngineConfig::new(dir.to_path_buf(), "templated".into());
    cfg.drafter_dir = Some(drafter_dir().clone());
    let (app, _e) = app(Engine::start(cfg).unwrap());

    let msgs = json!([{"role": "user", "content": "t5 t6"}, {"role": "assistant", "content": "t7"}, {"role": "user", "content": "t8"}]);
    let (s, v) =
        post(&app, "/v1/chat/completions", &json!({"messages": msgs, "max_tokens": 4, "temperature": 0})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // <bos> t5 t6 t9 t7 t9 t8 t9 t10: the template's text, encoded without added specials.
    assert_eq!(v["usage"]["prompt_tokens"], 9, "{v}");
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let want = tok.encode("<bos>t5 t6 t9 t7 t9 t8 t9 t10", false).unwrap();
    assert_eq!(want.len(), 9);
    let via_cli_rule =
        serve::chat::chat_ids(&tok, gemma4::chat_template::ChatTemplate::of(&tok).unwrap().as_ref(), &msgs).unwrap();
    assert_eq!(via_cli_rule, want);

    let sys = json!([{"role": "system", "content": "t5"}, {"role": "user", "content": "t6"}]);
    let (s, v) = post(&app, "/v1/chat/completions", &json!({"messages": sys})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], "messages");
    assert!(v["error"]["message"].as_str().unwrap().contains("system messages are not supported"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleaved_sessions_answer_as_they_do_one_at_a_time() {
    let bodies: Vec<Value> = (0..6)
        .map(|i| {
            let prompt = format!("t{} t{} t{}", 5 + i, 20 + i, 40 + i);
            if i % 2 == 0 {
                json!({"prompt": prompt, "max_tokens": 12, "temperature": 0})
            } else {
                json!({"prompt": prompt, "max_tokens": 12, "temperature": 0.9, "seed": i, "stream": i % 3 == 0})
            }
        })
        .collect();
    let text = |s: StatusCode, raw: &[u8], stream: bool| -> String {
        assert_eq!(s, StatusCode::OK);
        if stream {
            streamed_text(&sse_frames(raw)).0
        } else {
            let v: Value = serde_json::from_slice(raw).unwrap();
            v["choices"][0]["text"].as_str().unwrap().to_string()
        }
    };
    let (serial_app, _a) = app(engine(true, 1));
    let mut serial = Vec::new();
    for b in &bodies {
        let (s, raw) = call(&serial_app, "POST", "/v1/completions", b.to_string()).await;
        serial.push(text(s, &raw, b["stream"] == json!(true)));
    }
    let (app, e) = app(engine(true, 3));
    let handles: Vec<_> = bodies
        .iter()
        .map(|b| {
            let (app, b) = (app.clone(), b.clone());
            tokio::spawn(async move {
                let (s, raw) = call(&app, "POST", "/v1/completions", b.to_string()).await;
                (s, raw, b["stream"] == json!(true))
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let (s, raw, stream) = h.await.unwrap();
        assert_eq!(text(s, &raw, stream), serial[i], "request {i}");
    }
    assert_eq!(e.counters().completed.load(std::sync::atomic::Ordering::Relaxed), bodies.len());
}
