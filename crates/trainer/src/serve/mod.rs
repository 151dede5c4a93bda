//! `tinygpt serve`: an OpenAI-compatible API (completions, chat, tokenize) and a browser
//! playground over one trained run.
//!
//! Requests arrive on tokio's threads (axum: [`routes`], [`completions`], [`chat`],
//! [`tokenize`], [`attention`]); requests are checked field by field ([`fields`]). The model
//! runs only on a fixed pool of worker threads ([`pool`]), fed from a bounded queue: when the
//! queue is full a request gets 429 at once instead of waiting without bound. A worker decodes
//! many requests in one batch ([`batcher`]; what a request asks for and gets: [`generation`]).
//! Answers go back whole or streamed ([`reply`]). A client that
//! disconnects drops its event channel, and its generation stops at the next token.

mod api;
mod attention;
mod batcher;
mod chat;
mod completions;
mod connections;
mod descriptors;
mod fields;
mod generation;
mod job;
mod options;
mod playground;
mod pool;
mod reply;
mod routes;
mod state;
mod stats;
mod tokenize;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::Either;

use anyhow::{Context, Result};

pub use connections::ConnectionLimits;
pub use options::ServeOptions;
pub(crate) use playground::file as compiled_file;
pub use pool::{Model, Stats};
pub(crate) use routes::{bearer_token, key_matches};

use crate::chat::Message;

/// Serves `model` (named `name` in the API) until Ctrl-C or SIGTERM, then lets in-flight
/// requests finish. `on_listening` is told the bound address once requests can arrive.
pub fn serve(
    name: String,
    model: Model,
    options: ServeOptions,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<()> {
    options.validate()?;
    let hello = [Message::new("user", "Hello")];
    let rendered = options.chat_template.render(&hello);
    if let Err(e) = rendered.and_then(|text| model.tokenizer.encode_with_specials(&text)) {
        eprintln!(
            "note: the chat template cannot write a conversation for this model ({e:#}); \
             /v1/chat/completions will refuse requests (see --chat-template)"
        );
    }
    let model = Arc::new(model);
    let pool = pool::Pool::start(
        model.clone(),
        options.max_concurrent,
        options.max_batch,
        options.queue,
    )?;
    let state = Arc::new(state::State::new(name, &model, pool, options.clone()));
    let http = Http {
        command: "serve",
        addr: options.addr,
        limits: options.connections.clone(),
        shutdown_timeout: options.shutdown_timeout,
        stats: state.pool.stats.clone(),
    };
    let result = http.run(routes::router(state.clone()), on_listening);
    state.pool.shut_down();
    result
}

/// An HTTP server of tinygpt's (`serve`, `watch`): where it listens, its connection limits,
/// its shutdown deadline and the counters its connections keep.
pub(crate) struct Http {
    /// The command, as its log lines begin.
    pub command: &'static str,
    pub addr: SocketAddr,
    pub limits: ConnectionLimits,
    pub shutdown_timeout: Duration,
    pub stats: Arc<Stats>,
}

impl Http {
    /// Serves `router` until Ctrl-C or SIGTERM (see [`serve_until_stopped`]); `on_listening`
    /// is told the bound address once requests can arrive.
    pub fn run(self, router: axum::Router, on_listening: impl FnOnce(SocketAddr)) -> Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            // Timers too: the connections' timeouts and the pause after a failed accept.
            .enable_all()
            .build()
            .context("cannot start the server's runtime")?;
        let result = runtime.block_on(async {
            let signals = StopSignals::listen()?;
            let listener = tokio::net::TcpListener::bind(self.addr)
                .await
                .with_context(|| format!("cannot listen on {}", self.addr))?;
            on_listening(listener.local_addr()?);
            serve_until_stopped(signals, listener, router, &self).await
        });
        // Connections still open past the deadline go with their tasks: their event channels
        // close, and the workers writing to them stop at their next token and can be joined.
        runtime.shutdown_background();
        result
    }
}

/// Serves until the first Ctrl-C or SIGTERM, then lets the requests in flight finish; at
/// `--shutdown-timeout`, or at a second signal, drops the connections still open (their
/// generations stop at their next token).
async fn serve_until_stopped(
    mut signals: StopSignals,
    listener: tokio::net::TcpListener,
    router: axum::Router,
    http: &Http,
) -> Result<()> {
    let timeout = http.shutdown_timeout;
    let (stopping, stopped) = tokio::sync::watch::channel(false);
    let mut limits = http.limits.clone();
    limits.max_connections = descriptors::connection_budget(limits.max_connections);
    let server = connections::serve(listener, router, limits, http.stats.clone(), stopped);
    let command = http.command;
    let stopper = async move {
        signals.next().await;
        eprintln!(
            "{command}: stopping: finishing the requests in flight (for at most {}; Ctrl-C \
             again to stop now)",
            humantime::format_duration(timeout)
        );
        let _ = stopping.send(true);
        let deadline = Box::pin(tokio::time::sleep(timeout));
        match futures_util::future::select(deadline, Box::pin(signals.next())).await {
            Either::Left(_) => eprintln!("{command}: --shutdown-timeout reached: closing the rest"),
            Either::Right(_) => eprintln!("{command}: a second signal: closing the rest"),
        }
    };
    // The server ends by itself once stopping has let every connection finish; the signals'
    // side ends first only at the deadline or a second signal, and dropping the server's
    // future then drops the connections left.
    futures_util::future::select(Box::pin(server), Box::pin(stopper)).await;
    Ok(())
}

/// Ctrl-C and SIGTERM, listened for from the moment this is made: before the server accepts
/// anything (a signal that came before would end the process unasked, and without a word).
struct StopSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn listen() -> Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let cannot = "cannot listen for Ctrl-C and SIGTERM";
            Ok(Self {
                interrupt: signal(SignalKind::interrupt()).context(cannot)?,
                terminate: signal(SignalKind::terminate()).context(cannot)?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// The next Ctrl-C or SIGTERM.
    async fn next(&mut self) {
        #[cfg(unix)]
        futures_util::future::select(
            Box::pin(self.interrupt.recv()),
            Box::pin(self.terminate.recv()),
        )
        .await;
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
