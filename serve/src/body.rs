//! Request bodies are read whole before a handler runs, within a size limit and a time limit:
//! a declared `Content-Length` over the limit is refused (413) before any byte is read, a
//! chunked body is refused (413) once it passes the limit, and a body that does not arrive in
//! time gets 408. Either way a client cannot hold a request open by sending slowly.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{CONNECTION, CONTENT_LENGTH};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use crate::api_error::ApiError;

/// How much of a body, and for how long, is read.
#[derive(Clone, Copy, Debug)]
pub struct BodyPolicy {
    /// Largest body accepted, in bytes.
    pub limit: usize,
    /// Longest wait for the whole body, from the end of the headers.
    pub timeout: Duration,
}

/// Middleware: reads the body within `policy`, then passes the request on with the body in
/// memory.
pub async fn read_body(State(policy): State<BodyPolicy>, req: Request, next: Next) -> Response {
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > policy.limit as u64) {
        return refusal(too_large(policy.limit));
    }
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(policy.timeout, collect(body, policy.limit)).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Ok(Err(e)) => refusal(e),
        Err(_) => refusal(ApiError::http(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within {} s", policy.timeout.as_secs_f64()),
        )),
    }
}

/// The body's bytes, refused once they pass `limit`.
async fn collect(body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::invalid(None, format!("the request body could not be read: {e}")))?;
        if buf.len() + chunk.len() > limit {
            return Err(too_large(limit));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
}

fn too_large(limit: usize) -> ApiError {
    ApiError::http(StatusCode::PAYLOAD_TOO_LARGE, format!("the request body is over the limit of {limit} bytes"))
}

/// A refusal that also closes the connection: the rest of the body was never read, so the
/// connection cannot carry another request.
fn refusal(e: ApiError) -> Response {
    let mut r = e.into_response();
    r.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    r
}
