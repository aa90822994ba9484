//! `--api-key`: every route but `GET /health` needs `Authorization: Bearer KEY`; a missing or
//! wrong key gets 401 `invalid_api_key`. The key is compared in constant time.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api_error::ApiError;

/// The one route open without a key: load balancers and probes carry none.
const OPEN_PATH: &str = "/health";

/// Middleware: passes requests that carry `key` as a bearer token (and health checks).
pub async fn require_key(State(key): State<Arc<str>>, req: Request, next: Next) -> Response {
    if req.uri().path() == OPEN_PATH {
        return next.run(req).await;
    }
    let given = req.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer);
    match given {
        Some(token) if same(token.as_bytes(), key.as_bytes()) => next.run(req).await,
        Some(_) => ApiError::unauthorized("incorrect API key provided").into_response(),
        None => ApiError::unauthorized(
            "no API key provided; send it as 'Authorization: Bearer KEY' (the server's --api-key)",
        )
        .into_response(),
    }
}

/// The token of an `Authorization: Bearer TOKEN` header (the scheme is case-insensitive).
fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim_start())
}

/// Equality whose time depends on the lengths only, not on where the bytes first differ (so a
/// client cannot find the key a byte at a time).
fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..n {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    // Keeps the optimizer from ending the loop at the first difference.
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::{bearer, same};

    #[test]
    fn bearer_tokens_compare_whole() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc"), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("abc"), None);
        assert!(same(b"key", b"key"));
        assert!(!same(b"key", b"kez"));
        assert!(!same(b"key", b"key1"));
        assert!(!same(b"", b"k"));
        assert!(same(b"", b""));
    }
}
