//! `logit_bias` through the HTTP routes: it moves the greedy pick exactly as plain decoding with
//! the same bias does, in the plain and the speculative engine alike, and bad maps are refused
//! with a 400 naming the field.

mod common;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::Router;
use gemma4::generate::{generate, GenerateConfig};
use gemma4::sampling::SamplerConfig;
use gemma4::tokenizer::Tokenizer;
use gemma4::Model;
use serde_json::{json, Value};
use serve::{router, Engine, RouterConfig};

use common::{engine, target_dir};

const LIMIT: usize = 64 * 1024;
const PROMPT: [u32; 5] = [5, 6, 7, 8, 9];

fn app(engine: Engine) -> Router {
    router(Arc::new(engine), RouterConfig::new(LIMIT))
}

async fn post(app: &Router, body: &Value) -> (StatusCode, Value) {
    common::post(app, "/v1/completions", body).await
}

/// The completion text of a greedy request with `bias`, which must succeed.
async fn greedy_text(app: &Router, bias: &Value, max_tokens: usize) -> String {
    let body = json!({"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "logit_bias": bias});
    let (s, v) = post(app, &body).await;
    assert_eq!(s, StatusCode::OK, "{body} -> {v}");
    assert_eq!(v["usage"]["completion_tokens"], max_tokens, "{v}");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// Plain greedy decoding of the prompt on this thread, with `bias`: the reference.
fn plain_tokens(bias: Vec<(u32, f32)>, max_tokens: usize) -> Vec<u32> {
    let m = Model::load(target_dir()).unwrap();
    let tok = Tokenizer::from_dir(target_dir()).unwrap();
    let cfg = GenerateConfig {
        max_tokens,
        sampler: SamplerConfig { logit_bias: bias, ..SamplerConfig::greedy() },
        stop_tokens: gemma4::tokenizer::stop_tokens(m.config(), Some(&tok)),
        ..Default::default()
    };
    generate(&m, &PROMPT, &cfg, |_| {}).unwrap().tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bias_moves_greedy_output_alike_in_plain_and_speculative_engines() {
    let tok = Tokenizer::from_dir(target_dir()).unwrap();
    let unbiased = tokio::task::spawn_blocking(|| plain_tokens(vec![], 8)).await.unwrap();
    // Ban the first unbiased pick and push a few tokens by amounts that are not round numbers.
    let bias = vec![(unbiased[0], -100.0), (17, 3.1), (250, 4.6), (401, 2.05)];
    let want = tokio::task::spawn_blocking({
        let bias = bias.clone();
        move || plain_tokens(bias, 8)
    })
    .await
    .unwrap();
    assert_ne!(want[0], unbiased[0]);
    let bias_json: Value =
        bias.iter().map(|&(id, b)| (id.to_string(), json!(b))).collect::<serde_json::Map<_, _>>().into();
    let forced = json!({"321": 100});
    let forced_text = tok.decode(&[321; 6]).unwrap();
    let mut texts = Vec::new();
    for speculative in [false, true] {
        let app = app(engine(speculative, 1));
        // +100 on token 321: greedy emits it at every step.
        assert_eq!(greedy_text(&app, &forced, 6).await, forced_text, "speculative: {speculative}");
        let text = greedy_text(&app, &bias_json, 8).await;
        assert_eq!(text, tok.decode(&want).unwrap(), "speculative: {speculative}");
        assert_ne!(text, greedy_text(&app, &json!({}), 8).await, "the bias acts (speculative: {speculative})");
        // null is absent.
        assert_eq!(greedy_text(&app, &Value::Null, 8).await, tok.decode(&unbiased).unwrap());
        texts.push(text);
    }
    assert_eq!(texts[0], texts[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_logit_biases_get_400_naming_the_field() {
    let app = app(engine(true, 1));
    let too_many: serde_json::Map<String, Value> = (0..301).map(|i| (i.to_string(), json!(1))).collect();
    for (bias, says) in [
        (json!({"abc": 1}), "\"abc\" is not a token id"),
        (json!({"-1": 1}), "\"-1\" is not a token id"),
        (json!({"512": 1}), "token id 512"),
        (json!({"99999999999": 1}), "is not a token id"),
        (json!({"5": 101}), "got 101"),
        (json!({"5": -100.5}), "got -100.5"),
        (json!({"5": "NaN"}), "got \"NaN\""),
        (json!({"5": "1"}), "must be a number"),
        (json!({"5": null}), "must be a number"),
        (json!({"5": 1, "05": 2}), "more than once"),
        (json!([1, 2]), "logit_bias"),
        (json!(3), "logit_bias"),
        (Value::Object(too_many), "at most 300"),
    ] {
        let body = json!({"prompt": PROMPT, "max_tokens": 2, "temperature": 0, "logit_bias": bias});
        let (s, v) = post(&app, &body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bias} -> {v}");
        assert_eq!(v["error"]["param"], "logit_bias", "{bias} -> {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("logit_bias") && msg.contains(says), "{bias}: {msg}");
    }
    // The edges are served: ±100 and 300 entries.
    let edge: serde_json::Map<String, Value> = (0..300).map(|i| (i.to_string(), json!(-100))).collect();
    for bias in [json!({"5": 100, "6": -100.0}), Value::Object(edge)] {
        let (s, v) =
            post(&app, &json!({"prompt": PROMPT, "max_tokens": 2, "temperature": 0, "logit_bias": bias})).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
}
