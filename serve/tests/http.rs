//! HTTP fidelity and hardening: usage counted once in streams, status codes (404, 405, 413),
//! `GET /v1/models/{id}`, random response ids, `response_format`, the API key, and the
//! connection timeouts and shutdown grace against a real listener.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use serve::{router, RouterConfig, ServerConfig};
use std::io::{Read, Write};
use std::net::TcpStream;

use tokio::net::TcpListener;
use tower::ServiceExt;

use common::{engine, frames as sse_frames, post};

const LIMIT: usize = 64 * 1024;

fn app_with(cfg: RouterConfig) -> Router {
    router(Arc::new(engine(false, 2)), cfg)
}

/// Status, headers and body of one request through the router.
async fn call(app: &Router, req: HttpRequest<Body>) -> (StatusCode, axum::http::HeaderMap, Value) {
    let resp = app.clone().oneshot(req).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, headers, v)
}

fn req(method: &str, path: &str, body: impl Into<Body>) -> HttpRequest<Body> {
    HttpRequest::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap()
}

fn assert_error(v: &Value, kind: &str, code: Option<&str>, param: Option<&str>) {
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert_eq!(v["error"]["code"].as_str(), code, "{v}");
    assert_eq!(v["error"]["param"].as_str(), param, "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.len() > 10), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_carry_usage_once_on_the_usage_only_chunk() {
    let app = app_with(RouterConfig::new(LIMIT));
    for (path, mut body) in [
        ("/v1/completions", json!({"prompt": "t5 t6", "max_tokens": 6, "temperature": 0})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "t5"}], "max_tokens": 6, "temperature": 0}),
        ),
    ] {
        let (s, whole) = post(&app, path, &body).await;
        assert_eq!(s, StatusCode::OK, "{whole}");
        assert_eq!(whole["usage"]["completion_tokens"], 6, "{whole}");

        body["stream"] = json!(true);
        let (s, raw) = post(&app, path, &body).await;
        assert_eq!(s, StatusCode::OK);
        let frames = sse_frames(&raw);
        assert!(frames.iter().all(|f| f["usage"].is_null()), "usage without include_usage: {raw}");

        body["stream_options"] = json!({"include_usage": true});
        let (_, raw) = post(&app, path, &body).await;
        let frames = sse_frames(&raw);
        let with_usage: Vec<&Value> = frames.iter().filter(|f| !f["usage"].is_null()).collect();
        assert_eq!(with_usage.len(), 1, "{raw}");
        assert_eq!(with_usage[0]["choices"], json!([]), "{raw}");
        assert_eq!(with_usage[0]["usage"]["completion_tokens"], 6);
        assert_eq!(frames.last(), Some(with_usage[0]));
        // The finish chunk is still there, without usage.
        assert!(frames.iter().any(|f| f["choices"][0]["finish_reason"] == "length"), "{raw}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_models_are_404_and_the_served_one_has_a_card() {
    let app = app_with(RouterConfig::new(LIMIT));
    let (s, v) = post(&app, "/v1/completions", &json!({"model": "nope", "prompt": "t5"})).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    assert_error(&v, "invalid_request_error", Some("model_not_found"), Some("model"));

    let (s, _, v) = call(&app, req("GET", "/v1/models/tiny", Body::empty())).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["id"], "tiny");
    assert_eq!(v["object"], "model");
    // Ids with slashes (Hugging Face style) reach the model check, not the route fallback.
    for path in ["/v1/models/gpt-4", "/v1/models/google/gemma-4-e2b-it"] {
        let (s, _, v) = call(&app, req("GET", path, Body::empty())).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}: {v}");
        assert_error(&v, "invalid_request_error", Some("model_not_found"), Some("model"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_get_413_declared_or_chunked() {
    let app = app_with(RouterConfig::new(LIMIT));
    // The header alone decides: the body is never sent.
    let declared = HttpRequest::builder()
        .method("POST")
        .uri("/v1/completions")
        .header("content-length", "1000000000")
        .body(Body::empty())
        .unwrap();
    let (s, _, v) = call(&app, declared).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_error(&v, "invalid_request_error", None, None);

    // No length: refused once the chunks pass the limit.
    let chunk = axum::body::Bytes::from(vec![b' '; 16 * 1024]);
    let chunks = futures_util::stream::iter((0..8).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
    let (s, _, v) = call(&app, req("POST", "/v1/completions", Body::from_stream(chunks))).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_error(&v, "invalid_request_error", None, None);

    // Under the limit, chunked, is served.
    let small = futures_util::stream::iter(
        [r#"{"prompt": "t5", "#, r#""max_tokens": 2}"#].map(|s| Ok::<_, std::io::Error>(axum::body::Bytes::from(s))),
    );
    let (s, _, v) = call(&app, req("POST", "/v1/completions", Body::from_stream(small))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_gets_405_json_and_an_unknown_route_404_json() {
    let app = app_with(RouterConfig::new(LIMIT));
    let (s, headers, v) = call(&app, req("GET", "/v1/chat/completions", Body::empty())).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED, "{v}");
    assert_error(&v, "invalid_request_error", None, None);
    assert_eq!(headers.get("allow").and_then(|a| a.to_str().ok()), Some("POST"));
    let (s, _, v) = call(&app, req("GET", "/v1/nothing", Body::empty())).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    assert_error(&v, "invalid_request_error", None, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_ids_are_random_and_prefixed() {
    let app = app_with(RouterConfig::new(LIMIT));
    let chat = json!({"messages": [{"role": "user", "content": "t5"}], "max_tokens": 1});
    let comp = json!({"prompt": "t5", "max_tokens": 1});
    let mut seen = Vec::new();
    for (path, body, prefix) in [
        ("/v1/completions", &comp, "cmpl-"),
        ("/v1/completions", &comp, "cmpl-"),
        ("/v1/chat/completions", &chat, "chatcmpl-"),
        ("/v1/chat/completions", &chat, "chatcmpl-"),
    ] {
        let (s, v) = post(&app, path, body).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let id = v["id"].as_str().unwrap().to_string();
        let random = id.strip_prefix(prefix).unwrap_or_else(|| panic!("{id} lacks {prefix}"));
        assert!(random.len() >= 16 && random.bytes().all(|c| c.is_ascii_alphanumeric()), "{id}");
        assert!(!seen.contains(&id), "{id} repeated");
        seen.push(id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_format_other_than_text_is_refused() {
    let app = app_with(RouterConfig::new(LIMIT));
    let chat =
        |rf: Value| json!({"messages": [{"role": "user", "content": "t5"}], "max_tokens": 1, "response_format": rf});
    for rf in [json!({"type": "json_object"}), json!({"type": "json_schema", "json_schema": {"name": "x"}})] {
        let (s, v) = post(&app, "/v1/chat/completions", &chat(rf)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert_error(&v, "invalid_request_error", None, Some("response_format"));
        assert!(v["error"]["message"].as_str().unwrap().contains("not supported by this server"), "{v}");
    }
    for rf in [json!({"type": "text"}), Value::Null] {
        let (s, v) = post(&app, "/v1/chat/completions", &chat(rf)).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_guards_every_route_but_health() {
    let app = app_with(RouterConfig { api_key: Some("sk-right".into()), ..RouterConfig::new(LIMIT) });
    let with = |auth: Option<&str>, method: &str, path: &str, body: &str| {
        let mut r = req(method, path, body.to_string());
        if let Some(a) = auth {
            r.headers_mut().insert("authorization", a.parse().unwrap());
        }
        r
    };
    let body = r#"{"prompt": "t5", "max_tokens": 1}"#;
    for auth in [None, Some("Bearer sk-wrong"), Some("Bearer sk-righ"), Some("Bearer sk-right2"), Some("sk-right")] {
        for (method, path) in [("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/v1/nothing")] {
            let (s, _, v) = call(&app, with(auth, method, path, body)).await;
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{auth:?} {path}: {v}");
            assert_error(&v, "invalid_request_error", Some("invalid_api_key"), None);
        }
    }
    let (s, _, v) = call(&app, with(Some("Bearer sk-right"), "POST", "/v1/completions", body)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, _, v) = call(&app, with(Some("Bearer sk-right"), "GET", "/v1/models", "")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, _, v) = call(&app, with(None, "GET", "/health", "")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

// ---- A real listener: timeouts and shutdown (the raw clients block, on blocking threads) ----

/// A server on 127.0.0.1 with `cfg`; sending on (or dropping) the sender shuts it down.
async fn start(
    cfg: ServerConfig,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let eng = engine(false, 2);
    let task = tokio::spawn(async move {
        serve::server::serve(eng, listener, cfg, async move {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    (addr, tx, task)
}

fn short(grace_secs: u64, body_secs: u64) -> ServerConfig {
    ServerConfig {
        router: RouterConfig { body_timeout: Duration::from_secs(body_secs), ..RouterConfig::new(LIMIT) },
        header_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(3),
        shutdown_grace: Duration::from_secs(grace_secs),
    }
}

/// Everything the server sends until it closes the connection; fails past `within`.
fn read_until_closed(conn: &mut TcpStream, within: Duration) -> String {
    let t0 = Instant::now();
    conn.set_read_timeout(Some(within)).unwrap();
    let mut out = Vec::new();
    let r = conn.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    // A reset after the server dropped the socket counts as closed too.
    if let Err(e) = r {
        assert!(
            !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
            "still open after {within:?}; got {text:?}"
        );
    }
    assert!(t0.elapsed() <= within + Duration::from_millis(200), "closed only after {:?}", t0.elapsed());
    text
}

/// One response on a keep-alive connection (read until its body is complete).
fn read_response(conn: &mut TcpStream) -> String {
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&out));
        out.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&out);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head.lines().find_map(|l| {
                l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap())
            });
            if len.is_some_and(|n| body.len() >= n) {
                return text.into_owned();
            }
        }
    }
}

fn slow_clients(addr: std::net::SocketAddr) {
    // A partial head, then nothing: closed at the header timeout (1 s).
    let t0 = Instant::now();
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
    let got = read_until_closed(&mut c, Duration::from_secs(5));
    assert!(!got.contains("200 OK"), "{got}");
    assert!(t0.elapsed() >= Duration::from_millis(900), "{:?}", t0.elapsed());

    // Connected and silent: the first head is owed within the header timeout too.
    let t0 = Instant::now();
    let mut c = TcpStream::connect(addr).unwrap();
    read_until_closed(&mut c, Duration::from_secs(5));
    assert!(t0.elapsed() < Duration::from_millis(2900), "{:?}", t0.elapsed());

    // A body of 10 of its declared 100 bytes: 408 at the body timeout (1 s), then closed.
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":",
    )
    .unwrap();
    let got = read_until_closed(&mut c, Duration::from_secs(5));
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("invalid_request_error"), "{got}");

    // A huge declared length: 413 at once, nothing of the body sent.
    let t0 = Instant::now();
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n").unwrap();
    let got = read_until_closed(&mut c, Duration::from_secs(5));
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(t0.elapsed() < Duration::from_millis(900), "{:?}", t0.elapsed());

    // Keep-alive: idle longer than the header timeout is fine; past the idle timeout (3 s) the
    // connection closes.
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(read_response(&mut c).starts_with("HTTP/1.1 200"));
    std::thread::sleep(Duration::from_millis(1800));
    c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(read_response(&mut c).starts_with("HTTP/1.1 200"));
    let t0 = Instant::now();
    read_until_closed(&mut c, Duration::from_secs(6));
    assert!(t0.elapsed() >= Duration::from_millis(2500), "{:?}", t0.elapsed());

    // A stream its client reads slowly outlives every timeout.
    let body = json!({"prompt": "t5 t6", "max_tokens": 200, "temperature": 0, "stream": true}).to_string();
    let mut c = TcpStream::connect(addr).unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body.as_bytes()).unwrap();
    let mut first = [0u8; 64];
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let n = c.read(&mut first).unwrap();
    assert!(first[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&first[..n]));
    std::thread::sleep(Duration::from_secs(4));
    let rest = read_until_closed(&mut c, Duration::from_secs(30));
    assert!(rest.contains("data: [DONE]"), "{rest}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_but_idle_and_streams_have_their_own_limits() {
    let (addr, _stop, _task) = start(short(5, 1)).await;
    tokio::task::spawn_blocking(move || slow_clients(addr)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_a_stalled_connection_after_the_grace_period() {
    // The body timeout (30 s) is far past the grace (1 s): only the grace can end it.
    let (addr, stop, task) = start(short(1, 30)).await;
    let (mut stalled, mut idle) = tokio::task::spawn_blocking(move || {
        let mut stalled = TcpStream::connect(addr).unwrap();
        stalled
            .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
            .unwrap();
        let mut idle = TcpStream::connect(addr).unwrap();
        idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert!(read_response(&mut idle).starts_with("HTTP/1.1 200"));
        std::thread::sleep(Duration::from_millis(200));
        (stalled, idle)
    })
    .await
    .unwrap();

    let t0 = Instant::now();
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(4), task).await.expect("no exit within grace + 3 s").unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(900), "left before the grace: {:?}", t0.elapsed());
    tokio::task::spawn_blocking(move || {
        read_until_closed(&mut stalled, Duration::from_secs(1));
        read_until_closed(&mut idle, Duration::from_secs(1));
    })
    .await
    .unwrap();
}
