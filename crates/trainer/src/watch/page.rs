//! The page: HTML, stylesheet and script compiled into the binary (no CDN, no framework, no
//! build step), so it works offline.

use axum::response::Response;

use crate::serve::compiled_file;

const PAGE: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/watch.js");
const STYLE: &str = include_str!("page/watch.css");

pub fn page() -> Response {
    compiled_file("text/html; charset=utf-8", PAGE)
}

pub fn script() -> Response {
    compiled_file("text/javascript; charset=utf-8", SCRIPT)
}

pub fn style() -> Response {
    compiled_file("text/css; charset=utf-8", STYLE)
}
