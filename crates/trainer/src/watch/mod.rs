//! `tinygpt watch`: a local page that follows training runs as they learn, and shows finished
//! ones the same way: their loss curves on one chart, tokens/s, the sample of each
//! evaluation, and the attention of a fixed prompt at each evaluation.
//!
//! The server ([`crate::serve::Http`]: the same connections, limits and shutdown as `serve`)
//! reads each run's `steps.csv`, `evals.jsonl` and `metrics.csv` ([`follow`]) and sends what
//! they gain to the page as server-sent events; the page ([`page`], compiled into the binary)
//! draws them.

mod follow;
mod page;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::serve::{ConnectionLimits, Http, Stats, bearer_token, key_matches};
use follow::Run;

/// How often the files are looked at for new lines.
const POLL: Duration = Duration::from_millis(500);

/// What to watch, and where.
pub struct WatchOptions {
    pub runs: Vec<PathBuf>,
    pub addr: SocketAddr,
    /// Required (as `?key=KEY` or `Authorization: Bearer KEY`) when set; a page beyond the
    /// loopback interface must have one.
    pub api_key: Option<String>,
}

struct Shared {
    runs: Vec<PathBuf>,
    api_key: Option<String>,
}

/// Serves the page for `options.runs` until Ctrl-C or SIGTERM; `on_listening` is told the
/// bound address.
pub fn watch(options: WatchOptions, on_listening: impl FnOnce(SocketAddr)) -> Result<()> {
    if !options.addr.ip().is_loopback() && options.api_key.is_none() {
        bail!(
            "--host {} makes the runs visible from the network: pass --api-key KEY too (then \
             open the page as http://HOST:PORT/?key=KEY)",
            options.addr.ip()
        );
    }
    for run in &options.runs {
        follow::check(run)?;
    }
    let shared = Arc::new(Shared {
        runs: options.runs,
        api_key: options.api_key,
    });
    let router = Router::new()
        .route("/", get(|| async { page::page() }))
        .route("/watch.js", get(|| async { page::script() }))
        .route("/watch.css", get(|| async { page::style() }))
        .route("/events", get(events))
        .fallback(|| async { (StatusCode::NOT_FOUND, "no such page") })
        .layer(middleware::from_fn_with_state(shared.clone(), authorize))
        .with_state(shared);
    let http = Http {
        command: "watch",
        addr: options.addr,
        limits: ConnectionLimits::default(),
        shutdown_timeout: Duration::from_secs(2),
        stats: Arc::new(Stats::default()),
    };
    http.run(router, on_listening)
}

/// With `--api-key`, every request must carry it: as `?key=` (an `EventSource` cannot send a
/// header) or `Authorization: Bearer`.
async fn authorize(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    if let Some(key) = &shared.api_key {
        let in_query = request.uri().query().and_then(|q| {
            q.split('&')
                .find_map(|pair| pair.strip_prefix("key="))
                .map(percent_decoded)
        });
        let given = in_query.as_deref().or(bearer_token(request.headers()));
        if !key_matches(given, key) {
            return (
                StatusCode::UNAUTHORIZED,
                "missing or wrong key: open the page as /?key=KEY (the --api-key of tinygpt watch)",
            )
                .into_response();
        }
    }
    next.run(request).await
}

/// The runs as server-sent events: each run whole at first (`reset`), then what its files
/// gain, every [`POLL`].
async fn events(State(shared): State<Arc<Shared>>) -> Response {
    let runs: Vec<Run> = shared.runs.iter().map(|dir| Run::new(dir)).collect();
    let stream = futures_util::stream::unfold((runs, true), |(mut runs, first)| async move {
        if !first {
            tokio::time::sleep(POLL).await;
        }
        let mut chunk = String::new();
        for (index, run) in runs.iter_mut().enumerate() {
            if let Some(update) = run.update(index) {
                chunk.push_str(&format!("data: {update}\n\n"));
            }
        }
        if chunk.is_empty() {
            // A comment: keeps proxies from closing a quiet stream.
            chunk.push_str(": quiet\n\n");
        }
        Some((Ok::<_, Infallible>(Bytes::from(chunk)), (runs, false)))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// `%XX` escapes of a query value as the bytes they stand for (`+` as a space).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
