//! The engine the router tests serve: the engine crate's fixtures (a tiny random target and a
//! drafter fitted to it).

#![allow(dead_code)]

use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use axum::Router;
pub use engine::testing::{drafter_dir, target_dir};
use http_body_util::BodyExt;
use serde_json::Value;
use serve::{Engine, EngineConfig};
use tower::ServiceExt;

/// An engine on the fixtures; speculative when `drafter`.
pub fn engine(drafter: bool, max_concurrency: usize) -> Engine {
    let mut cfg = EngineConfig::new(target_dir().clone(), "tiny".into());
    cfg.drafter_dir = drafter.then(|| drafter_dir().clone());
    cfg.max_concurrency = max_concurrency;
    Engine::start(cfg).expect("engine")
}

/// Status and body of a JSON POST through the router (a body that is not JSON, such as an SSE
/// stream, comes back as a JSON string).
pub async fn post(app: &Router, path: &str, body: &Value) -> (StatusCode, Value) {
    let req = HttpRequest::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into())))
}

/// The JSON chunks of an SSE body (as [`post`] returns it); it must end with `[DONE]`.
pub fn frames(v: &Value) -> Vec<Value> {
    let text = v.as_str().expect("an SSE body");
    let datas: Vec<&str> = text.split("\n\n").filter_map(|f| f.trim().strip_prefix("data: ")).collect();
    assert_eq!(datas.last(), Some(&"[DONE]"), "{text}");
    datas[..datas.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect()
}
