//! `tinygpt serve` through a real HTTP client on an ephemeral loopback port: OpenAI's
//! completions (whole and streamed) equal to `tinygpt generate`, every 4xx, 429 under a burst,
//! cancellation when a client disconnects, 50 concurrent streams, the attention route
//! (attention.rs), and clients that flood, stall or send too much.

mod attention;
#[path = "../common/mod.rs"]
mod common;
mod concurrency;
mod errors;
mod hostile;
mod int8;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;

use common::server::Server;
use common::*;
use serde_json::{Value, json};

/// A tiny trained run in `dir/run`.
fn trained(dir: &Path) {
    ok(train(
        dir,
        "run",
        &["--max-iters", "20", "--set", "train.learning_rate=1e-2"],
    ));
}

/// What `tinygpt generate` writes alone on the fused decoder for `prompt`: 60 tokens sampled at
/// temperature 0.8 from the top 20 with `seed`, as the tests' requests ask.
fn generate_alone(dir: &Path, prompt: &str, seed: usize, extra: &[&str]) -> String {
    generate_alone_on(dir, "fused", prompt, seed, extra)
}

/// [`generate_alone`] on `backend`.
fn generate_alone_on(
    dir: &Path,
    backend: &str,
    prompt: &str,
    seed: usize,
    extra: &[&str],
) -> String {
    let seed = seed.to_string();
    let args = [
        "generate",
        "--checkpoint",
        "run",
        "--prompt",
        prompt,
        "--max-new-tokens",
        "60",
        "--temperature",
        "0.8",
        "--top-k",
        "20",
        "--seed",
        &seed,
        "--backend",
        backend,
    ];
    ok(tinygpt(dir, &[&args[..], extra].concat()))
}

fn text(completion: &Value) -> &str {
    completion["choices"][0]["text"].as_str().unwrap()
}

#[test]
fn completions_equal_generate_whole_and_streamed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let server = Server::start(dir, "run", &["--backend", "fused"]);
    let request = json!({
        "model": "anything", "prompt": "Of Man", "max_tokens": 60, "temperature": 0.8,
        "top_k": 20, "seed": 7,
    });
    let (status, completion) = server.post_json("/v1/completions", &request);
    assert_eq!(status, 200, "{completion}");
    assert_eq!(completion["object"], "text_completion");
    assert_eq!(completion["model"], "run");
    assert_eq!(completion["choices"][0]["finish_reason"], "length");
    assert_eq!(
        completion["usage"],
        json!({"prompt_tokens": 6, "completion_tokens": 60, "total_tokens": 66})
    );
    let generated = text(&completion);
    assert_eq!(
        generated.chars().count(),
        60,
        "char tokenizer: a token is a character"
    );

    // The same seed and settings as `tinygpt generate`.
    let cli = generate_alone(dir, "Of Man", 7, &[]);
    assert_eq!(cli, format!("Of Man{generated}\n"));

    // Streamed: the same text in pieces, a finish chunk, the usage chunk, then [DONE].
    let mut streaming = request.clone();
    streaming["stream"] = json!(true);
    streaming["stream_options"] = json!({"include_usage": true});
    let (streamed, events) = server.stream(&streaming);
    assert_eq!(streamed, generated);
    assert!(events.len() >= 60, "{} chunks", events.len());
    let finish = &events[events.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = events.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 60);
    assert!(events.iter().all(|e| e["id"] == events[0]["id"]));

    // A stop sequence ends the text before it, with finish_reason "stop".
    let cut = generated.char_indices().nth(30).unwrap().0;
    let stop: String = generated[cut..].chars().take(3).collect();
    let mut stopping = request.clone();
    stopping["stop"] = json!([stop]);
    let (_, stopped) = server.post_json("/v1/completions", &stopping);
    let stopped_text = text(&stopped);
    assert!(generated.starts_with(stopped_text) && stopped_text.len() <= cut);
    assert!(!stopped_text.contains(&stop));
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    // Prompts as token ids, and the context shift past block_size.
    let ids: Vec<u32> = vec![0, 1, 2];
    let (status, by_ids) = server.post_json(
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 40, "seed": 1, "context_shift": true}),
    );
    assert_eq!(status, 200, "{by_ids}");
    assert_eq!(by_ids["usage"]["completion_tokens"], 40);

    let (status, models) = server.post_json("/v1/models", &json!({}));
    assert_eq!(status, 405, "{models}");
    let (status, kind, models) = server.get("/v1/models", None);
    assert_eq!((status, kind.as_str()), (200, "application/json"));
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "run");
    let health = server.health();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["block_size"], 16);
    assert_eq!(health["stats"]["completed"], 4);
    let (status, kind, page) = server.get("/", None);
    assert_eq!((status, kind.as_str()), (200, "text/html; charset=utf-8"));
    assert!(page.contains("tinygpt playground"));
    assert!(
        server
            .get("/playground.js", None)
            .1
            .starts_with("text/javascript")
    );
}

/// A socket to `server` whose reads give up after 10 s, so that a test waiting for an answer
/// that never comes fails instead of hanging.
fn connected(server: &Server) -> TcpStream {
    let socket = TcpStream::connect(server.host()).unwrap();
    socket
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    socket
}

/// A streaming request written by hand on a socket, read until its first token arrives.
fn open_stream(server: &Server, max_tokens: usize) -> TcpStream {
    let body = json!({"prompt": "Of", "max_tokens": max_tokens, "stream": true}).to_string();
    let mut socket = TcpStream::connect(server.host()).unwrap();
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        server.host(),
        body.len()
    )
    .unwrap();
    socket
}

/// Reads `socket` until `needle` has arrived: what was read, up to the read that brought it.
fn read_until(socket: &mut TcpStream, needle: &str) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(needle) {
        let n = socket.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "closed before {needle:?}: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}
