//! The browser playground: one HTML page, its stylesheet and its script, compiled into the
//! binary (no CDN, no build step), so it works offline.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const PAGE: &str = include_str!("playground/index.html");
const SCRIPT: &str = include_str!("playground/playground.js");
const STYLE: &str = include_str!("playground/playground.css");

pub fn page() -> Response {
    file("text/html; charset=utf-8", PAGE)
}

pub fn script() -> Response {
    file("text/javascript; charset=utf-8", SCRIPT)
}

pub fn style() -> Response {
    file("text/css; charset=utf-8", STYLE)
}

/// A file compiled into the binary, as a response (the `watch` page's too).
pub(crate) fn file(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}
