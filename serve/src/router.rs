//! The HTTP routes (axum): `POST /v1/completions`, `POST /v1/chat/completions`,
//! `GET /v1/models`, `GET /health`. Handlers validate the body ([`crate::params`]), queue a
//! job on the engine and answer with the whole response or a server-sent-event stream (one
//! `data: {…}` chunk per emitted piece, then `data: [DONE]`). A stream owns the job's event
//! receiver, so a client that goes away drops it and the engine cancels the job before its
//! next round.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use engine::{Engine, Event, Events, Job};
use serde::Serialize;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::api_error::ApiError;
use crate::openai::{Envelope, Health, ModelList};
use crate::params::{parse, Endpoint};

/// Request bodies larger than this are refused (HTTP 400), unless the router is built with
/// another limit.
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;

#[derive(Clone)]
struct App {
    engine: Arc<Engine>,
    body_limit: usize,
}

/// The routes over `engine`, refusing bodies over `body_limit` bytes.
pub fn router(engine: Arc<Engine>, body_limit: usize) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(list_models))
        .route("/health", get(health))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(App { engine, body_limit })
}

async fn health(State(app): State<App>) -> Response {
    let requests = app.engine.counters().snapshot();
    Json(Health { status: "ok", model: &app.engine.info().id, requests }).into_response()
}

async fn list_models(State(app): State<App>) -> Response {
    Json(ModelList::of(&app.engine.info().id)).into_response()
}

async fn not_found() -> Response {
    let mut e =
        ApiError::invalid(None, "no such route; see /v1/completions, /v1/chat/completions, /v1/models, /health");
    e.status = axum::http::StatusCode::NOT_FOUND;
    e.into_response()
}

async fn completions(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    handle(app, Endpoint::Completions, body).await
}

async fn chat(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    handle(app, Endpoint::Chat, body).await
}

static REQUESTS: AtomicU64 = AtomicU64::new(0);

async fn handle(app: App, endpoint: Endpoint, body: Result<Bytes, BytesRejection>) -> Response {
    match respond(app, endpoint, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn respond(app: App, endpoint: Endpoint, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body.map_err(|e| {
        ApiError::invalid(
            None,
            format!("the request body could not be read ({e}); bodies are limited to {} bytes", app.body_limit),
        )
    })?;
    let info = Arc::clone(app.engine.info());
    let parsed = parse(endpoint, &body, &info)?;
    let n = REQUESTS.fetch_add(1, Ordering::Relaxed);
    let prefix = match endpoint {
        Endpoint::Completions => "cmpl",
        Endpoint::Chat => "chatcmpl",
    };
    let env = Envelope {
        endpoint,
        id: format!("{prefix}-{n}"),
        created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        model: info.id.clone(),
    };
    let (tx, mut rx) = unbounded_channel();
    let job = Job { request: parsed.request, events: Box::new(Channel(tx)), label: env.id.clone() };
    app.engine.submit(job).map_err(|e| ApiError::internal(e.to_string()))?;

    // The first event decides the status: a request that fails before emitting gets a 500.
    let first = match rx.recv().await {
        None => return Err(ApiError::internal("the engine dropped the request")),
        Some(Event::Failed(m)) => return Err(ApiError::internal(m)),
        Some(ev) => ev,
    };
    if !parsed.stream {
        let mut ev = Some(first);
        loop {
            match ev {
                Some(Event::Done(o)) => return Ok(Json(env.full(&o)).into_response()),
                Some(Event::Failed(m)) => return Err(ApiError::internal(m)),
                None => return Err(ApiError::internal("the engine dropped the request")),
                Some(Event::Step(_)) => {}
            }
            ev = rx.recv().await;
        }
    }
    let mut stream = ChunkStream { rx, queue: VecDeque::new(), ended: false, env, include_usage: parsed.include_usage };
    if endpoint == Endpoint::Chat {
        stream.queue.push_back(frame(&stream.env.role_chunk()));
    }
    stream.push(first);
    let events = futures_util::stream::unfold(stream, |mut s| async move {
        loop {
            if let Some(frame) = s.queue.pop_front() {
                return Some((Ok::<_, Infallible>(SseEvent::default().data(frame)), s));
            }
            if s.ended {
                return None;
            }
            match s.rx.recv().await {
                Some(ev) => s.push(ev),
                None => s.push(Event::Failed("the engine dropped the request".into())),
            }
        }
    });
    Ok(Sse::new(events).into_response())
}

/// One SSE frame's JSON (serializing these bodies cannot fail: their keys are strings).
fn frame(body: &impl Serialize) -> String {
    serde_json::to_string(body).unwrap_or_else(|_| {
        r#"{"error": {"message": "a chunk could not be serialized", "type": "server_error"}}"#.to_string()
    })
}

/// A request's events, sent on a tokio channel to its handler (or its response stream).
struct Channel(UnboundedSender<Event>);

impl Events for Channel {
    fn send(&self, event: Event) {
        // A receiver that is gone is the engine's to notice (`is_closed`).
        let _ = self.0.send(event);
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// Turns engine events into SSE frames.
struct ChunkStream {
    rx: UnboundedReceiver<Event>,
    queue: VecDeque<String>,
    ended: bool,
    env: Envelope,
    include_usage: bool,
}

impl ChunkStream {
    fn push(&mut self, ev: Event) {
        match ev {
            Event::Step(s) => {
                if !s.text.is_empty() {
                    self.queue.push_back(frame(&self.env.chunk(&s.text, None)));
                }
            }
            Event::Done(o) => {
                self.queue.push_back(frame(&self.env.last_chunk(&o)));
                if self.include_usage {
                    self.queue.push_back(frame(&self.env.usage_chunk(&o)));
                }
                self.finish();
            }
            Event::Failed(m) => {
                // The status line is already sent: the error travels as a chunk.
                self.queue.push_back(frame(&ApiError::internal(m).body()));
                self.finish();
            }
        }
    }

    fn finish(&mut self) {
        self.queue.push_back("[DONE]".into());
        self.ended = true;
    }
}
