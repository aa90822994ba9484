//! The HTTP routes (axum): `POST /v1/completions`, `POST /v1/chat/completions`,
//! `GET /v1/models`, `GET /v1/models/{id}`, `GET /health`. Bodies are read whole first
//! ([`crate::body`]), and with an API key every route but `/health` checks it
//! ([`crate::auth`]); errors, 404 and 405 included, are JSON in OpenAI's shape. Handlers validate the body ([`crate::params`]), queue a
//! job on the engine and answer with the whole response or a server-sent-event stream (one
//! `data: {…}` chunk per emitted piece, then `data: [DONE]`). A stream owns the job's event
//! receiver, so a client that goes away drops it and the engine cancels the job before its
//! next round.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use engine::{Engine, Event, Events, Job};
use gemma4::chat_markup::{OutputParser, Part};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::api_error::ApiError;
use crate::auth::require_key;
use crate::body::{read_body, BodyPolicy};
use crate::ids;
use crate::openai::{frame, Delta, Envelope, Health, ModelCard, ModelList};
use crate::params::{parse, Endpoint};
use crate::reply::{Reply, ToolCallOut};

/// Request bodies larger than this are refused (HTTP 413), unless the router is built with
/// another limit.
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;

/// The longest wait for a request's whole body, unless the router is built with another.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// What the routes enforce besides the API itself.
#[derive(Clone, Debug)]
pub struct RouterConfig {
    /// Largest accepted request body, in bytes (413 past it).
    pub body_limit: usize,
    /// Longest wait for a request's whole body (408 past it).
    pub body_timeout: Duration,
    /// When set, every route but `GET /health` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
}

impl RouterConfig {
    /// Bodies up to `body_limit` bytes, the default body timeout, no API key.
    pub fn new(body_limit: usize) -> RouterConfig {
        RouterConfig { body_limit, body_timeout: DEFAULT_BODY_TIMEOUT, api_key: None }
    }
}

impl Default for RouterConfig {
    fn default() -> RouterConfig {
        RouterConfig::new(DEFAULT_BODY_LIMIT)
    }
}

#[derive(Clone)]
struct App {
    engine: Arc<Engine>,
}

/// The routes over `engine`, with `cfg`'s body limits and API key.
pub fn router(engine: Arc<Engine>, cfg: RouterConfig) -> Router {
    let policy = BodyPolicy { limit: cfg.body_limit, timeout: cfg.body_timeout };
    let app = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(list_models))
        // A wildcard: model ids such as `google/gemma-4-e2b-it` hold slashes.
        .route("/v1/models/{*id}", get(model_card))
        .route("/health", get(health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // `read_body` enforces the limit (413) before the handlers run; axum's own limit
        // (2 MiB by default) would otherwise refuse a larger configured one.
        .layer(DefaultBodyLimit::disable())
        .layer(from_fn_with_state(policy, read_body))
        .with_state(App { engine });
    // Outermost, so a request without the key is refused before its body is read.
    match cfg.api_key {
        Some(key) => app.layer(from_fn_with_state(Arc::<str>::from(key), require_key)),
        None => app,
    }
}

async fn health(State(app): State<App>) -> Response {
    let requests = app.engine.counters().snapshot();
    Json(Health { status: "ok", model: &app.engine.info().id, requests }).into_response()
}

async fn list_models(State(app): State<App>) -> Response {
    Json(ModelList::of(&app.engine.info().id)).into_response()
}

async fn model_card(State(app): State<App>, Path(id): Path<String>) -> Response {
    let served = &app.engine.info().id;
    if id == *served {
        return Json(ModelCard::of(served)).into_response();
    }
    ApiError::not_found(
        Some("model"),
        Some("model_not_found"),
        format!("the model '{id}' does not exist; this server serves '{served}'"),
    )
    .into_response()
}

const ROUTES: &str = "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health";

async fn not_found() -> Response {
    ApiError::not_found(None, None, format!("no such route; see {ROUTES}")).into_response()
}

// axum adds the `Allow` header to this fallback's answer.
async fn method_not_allowed() -> Response {
    ApiError::http(StatusCode::METHOD_NOT_ALLOWED, format!("this route does not take that method; see {ROUTES}"))
        .into_response()
}

async fn completions(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    handle(app, Endpoint::Completions, body).await
}

async fn chat(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    handle(app, Endpoint::Chat, body).await
}

async fn handle(app: App, endpoint: Endpoint, body: Result<Bytes, BytesRejection>) -> Response {
    match respond(app, endpoint, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn respond(app: App, endpoint: Endpoint, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body.map_err(|e| ApiError::invalid(None, format!("the request body could not be read ({e})")))?;
    let info = Arc::clone(app.engine.info());
    let parsed = parse(endpoint, &body, &info)?;
    let prefix = match endpoint {
        Endpoint::Completions => "cmpl",
        Endpoint::Chat => "chatcmpl",
    };
    let env = Envelope {
        endpoint,
        id: ids::fresh(prefix).map_err(|e| ApiError::internal(format!("no random source for the response id: {e}")))?,
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
                Some(Event::Done(o)) => {
                    let single = parsed.reply.single_call;
                    let reply = parsed.reply.parser().map(|p| Reply::of(p.read_to_end(&o.text), single));
                    return Ok(Json(env.full(&o, reply.as_ref())).into_response());
                }
                Some(Event::Failed(m)) => return Err(ApiError::internal(m)),
                None => return Err(ApiError::internal("the engine dropped the request")),
                Some(Event::Step(_)) => {}
            }
            ev = rx.recv().await;
        }
    }
    let mut stream = ChunkStream {
        rx,
        queue: VecDeque::new(),
        ended: false,
        env,
        include_usage: parsed.include_usage,
        parser: parsed.reply.parser(),
        single_call: parsed.reply.single_call,
        calls: 0,
    };
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
    /// Reads a chat reply's markup: thinking and tool calls become their own deltas.
    parser: Option<OutputParser>,
    /// `parallel_tool_calls: false`: calls after the first are not sent.
    single_call: bool,
    /// Tool calls sent so far.
    calls: usize,
}

impl ChunkStream {
    fn push(&mut self, ev: Event) {
        match ev {
            Event::Step(s) => match self.parser.as_mut() {
                Some(p) => {
                    let parts = p.push(&s.text);
                    self.send_parts(parts);
                }
                None if !s.text.is_empty() => self.queue.push_back(frame(&self.env.chunk(&s.text, None))),
                None => {}
            },
            Event::Done(o) => {
                if let Some(parts) = self.parser.as_mut().map(OutputParser::finish) {
                    self.send_parts(parts);
                }
                self.queue.push_back(frame(&self.env.last_chunk(&o, self.calls)));
                // The usage travels once, on its own chunk, and only when asked for.
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

    /// A delta per part: content, reasoning, or a whole tool call.
    fn send_parts(&mut self, parts: Vec<Part>) {
        for part in parts {
            let delta = match &part {
                Part::Content(s) => Delta { content: Some(s), ..Delta::default() },
                Part::Reasoning(s) => Delta { reasoning_content: Some(s), ..Delta::default() },
                Part::ToolCall(_) if self.single_call && self.calls > 0 => continue,
                Part::ToolCall(c) => {
                    self.calls += 1;
                    Delta { tool_calls: Some(vec![ToolCallOut::of(c, Some(self.calls - 1))]), ..Delta::default() }
                }
            };
            self.queue.push_back(self.env.delta_chunk(delta));
        }
    }

    fn finish(&mut self) {
        self.queue.push_back("[DONE]".into());
        self.ended = true;
    }
}
