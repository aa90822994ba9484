//! Errors a client sees, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`
//! with HTTP 400 for bad input (naming the field in `param`), 500 for internal failures, and
//! the statuses of the HTTP layer (401, 404, 405, 408, 413) in the same shape.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// An error response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status: 400 for a request this server refuses, 500 for a failure serving it,
    /// or one of the HTTP layer's (401, 404, 405, 408, 413).
    pub status: StatusCode,
    /// OpenAI's `message`: what went wrong, for a person (names the field and its value).
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error` or `server_error`.
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// OpenAI's `code`: a machine-readable reason where one applies (`model_not_found`,
    /// `context_length_exceeded`), else null.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// HTTP 400 about `param` (None when no single field is at fault).
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    /// HTTP 400 about `param` with a machine-readable `code`.
    pub fn invalid_code(param: &str, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { code: Some(code), ..ApiError::invalid(Some(param), message) }
    }

    /// HTTP 404: what the request names (`param`, e.g. the model) does not exist here.
    pub fn not_found(param: Option<&str>, code: Option<&'static str>, message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::NOT_FOUND, code, ..ApiError::invalid(param, message) }
    }

    /// HTTP 401 `invalid_api_key`: the bearer token is missing or wrong.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::UNAUTHORIZED, code: Some("invalid_api_key"), ..ApiError::invalid(None, message) }
    }

    /// An `invalid_request_error` with another status than 400 (405, 408, 413) and no field
    /// at fault.
    pub fn http(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, ..ApiError::invalid(None, message) }
    }

    /// HTTP 500: the request was fine, serving it failed.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The body.
    pub fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        }
    }
}

/// An error response's body.
#[derive(Clone, Debug, Serialize)]
pub struct ErrorBody<'a> {
    /// `error`: the one object OpenAI clients read an error from.
    pub error: ErrorDetail<'a>,
}

/// `error` of an error body.
#[derive(Clone, Debug, Serialize)]
pub struct ErrorDetail<'a> {
    /// `message`: what went wrong, for a person; OpenAI clients raise it as the exception's
    /// text.
    pub message: &'a str,
    /// `type`: `invalid_request_error` (HTTP 4xx) or `server_error` (HTTP 500).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `param`: the request field at fault, as a path (`temperature`, `messages[0].content`);
    /// null when no single field is.
    pub param: Option<&'a str>,
    /// `code`: `model_not_found`, `context_length_exceeded`, `invalid_api_key`, or null.
    pub code: Option<&'static str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}
