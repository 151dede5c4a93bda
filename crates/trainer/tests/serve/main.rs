//! `tinygpt serve` through a real HTTP client on an ephemeral loopback port: OpenAI's
//! completions (whole and streamed) equal to `tinygpt generate`, every 4xx, 429 under a burst,
//! cancellation when a client disconnects, 50 concurrent streams, the attention route
//! (attention.rs), and clients that flood, stall or send too much.

mod attention;
#[path = "../common/mod.rs"]
mod common;
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

/// Every bad request is a 4xx with OpenAI's error shape and a message naming the problem.
#[test]
fn bad_requests_get_openai_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let args = ["--max-tokens", "100", "--max-body-bytes", "2000"];
    let server = Server::start(dir, "run", &args);
    // Bodies of /v1/completions that are valid JSON, each with one mistake: 400.
    let long = "Of Man's first disobedience";
    let invalid = [
        (
            json!({"prompt": "Of", "frobnicate": 1}),
            "unknown field `frobnicate`",
        ),
        (
            json!({"prompt": "Of", "suffix": "end"}),
            "`suffix` is not supported",
        ),
        (
            json!({"prompt": "Of", "n": 2, "best_of": 3}),
            "`best_of` must equal `n`",
        ),
        (json!({"prompt": "Of", "logprobs": 6}), "between 0 and 5"),
        (
            json!({"prompt": "Of", "frequency_penalty": 2.5}),
            "`frequency_penalty` must be between -2 and 2",
        ),
        (
            json!({"prompt": "Of", "presence_penalty": -3}),
            "`presence_penalty` must be between -2 and 2",
        ),
        (
            json!({"prompt": "Of", "logit_bias": {"99999": 5}}),
            "`logit_bias` keys are token ids",
        ),
        (
            json!({"prompt": "Of", "logit_bias": {"1": 101}}),
            "between -100 and 100",
        ),
        (
            json!({"prompt": "Of", "temperature": "hot"}),
            "invalid type: string \"hot\"",
        ),
        (json!({"prompt": 7}), "`prompt` must be a string"),
        (json!({"max_tokens": 5}), "missing field `prompt`"),
        (
            json!({"prompt": "Of", "max_tokens": 101}),
            "between 1 and 100",
        ),
        (
            json!({"prompt": "Of", "max_tokens": 0}),
            "between 1 and 100",
        ),
        (
            json!({"prompt": long}),
            "the prompt is 27 tokens; this server takes at most 16",
        ),
        (
            json!({"prompt": "Of \u{1F600}"}),
            "never occurs in the training corpus",
        ),
        (json!({"prompt": ""}), "the prompt is empty"),
        (json!({"prompt": [1, 99999]}), "token id 99999 is outside"),
        (json!({"prompt": [[1], []]}), "the prompt is empty"),
        (json!({"prompt": "Of", "n": 17}), "between 1 and 16"),
        (
            json!({"prompt": ["a", "b", "c", "d", "e"], "n": 4}),
            "at most 16 choices",
        ),
        (json!({"prompt": "Of", "top_p": 0}), "top_p"),
        (
            json!({"prompt": "Of", "stop": ""}),
            "stop sequence is empty",
        ),
        (
            json!({"prompt": "Of", "stream_options": {}}),
            "only allowed with `stream: true`",
        ),
    ];
    let chat = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Of"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let invalid_chat = [
        (
            chat(json!({"tools": [{"type": "function"}]})),
            "`tools` is not supported",
        ),
        (
            chat(json!({"response_format": {"type": "json_object"}})),
            "`response_format`",
        ),
        (chat(json!({"messages": []})), "`messages` is empty"),
        (
            chat(json!({"messages": [{"role": "wizard", "content": "Of"}]})),
            "unknown role \"wizard\"",
        ),
        (
            chat(json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})),
            "only text",
        ),
        (chat(json!({"top_logprobs": 2})), "needs `logprobs: true`"),
        (
            chat(json!({"max_completion_tokens": 0})),
            "`max_completion_tokens` must be",
        ),
        (
            chat(json!({"frobnicate": true})),
            "unknown field `frobnicate`",
        ),
    ];
    let mut cases: Vec<(&str, String, u16, &str)> = invalid
        .iter()
        .map(|(body, message)| ("/v1/completions", body.to_string(), 400, *message))
        .chain(
            invalid_chat
                .iter()
                .map(|(body, message)| ("/v1/chat/completions", body.to_string(), 400, *message)),
        )
        .collect();
    cases.extend([
        (
            "/v1/completions",
            "{\"prompt\": \"Of".into(),
            400,
            "not valid",
        ),
        ("/v1/completions", String::new(), 400, "no body"),
        (
            "/v1/completions",
            "x".repeat(3000),
            413,
            "larger than the server's limit of 2000 bytes",
        ),
        (
            "/v1/attention",
            json!({"prompt": "Of", "layer": 1}).to_string(),
            400,
            "layer 1 does not exist",
        ),
        (
            "/v1/attention",
            json!({"prompt": long}).to_string(),
            400,
            "send `truncate: true`",
        ),
        (
            "/v1/detokenize",
            json!({"tokens": [1, 99999]}).to_string(),
            400,
            "token id 99999 is outside",
        ),
        (
            "/v1/tokenize",
            json!({"content": "\u{1F600}"}).to_string(),
            400,
            "never occurs in the training corpus",
        ),
        ("/v1/nothing", "{}".into(), 404, "no such route"),
    ]);
    for (path, body, status, message) in cases {
        let (got, text) = server.post(path, &body, None);
        let error: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path} {body:.80}: not JSON ({e}): {text}"));
        assert_eq!(got, status, "{path} {body:.80}: {text}");
        let error = &error["error"];
        let got_message = error["message"].as_str().unwrap();
        assert!(
            got_message.contains(message),
            "{path} {body:.80}: {got_message}"
        );
        assert_eq!(error["type"], "invalid_request_error", "{text}");
        assert!(!got_message.contains('\n'), "{got_message}");
    }
    // The server is still fine afterwards.
    let (status, _) = server.post_json("/v1/completions", &json!({"prompt": "Of"}));
    assert_eq!(status, 200);
}

#[test]
fn api_key_is_checked_and_required_off_loopback() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    fails(
        tinygpt(dir, &["serve", "--checkpoint", "run", "--host", "0.0.0.0"]),
        "--host 0.0.0.0 makes the model reachable from the network: pass --api-key KEY",
    );
    fails(
        tinygpt(
            dir,
            &["serve", "--checkpoint", "run", "--max-prompt-tokens", "0"],
        ),
        "--max-prompt-tokens must be at least 1",
    );
    fails(
        tinygpt(dir, &["serve", "--checkpoint", "missing"]),
        "checkpoint missing does not exist",
    );
    let server = Server::start(dir, "run", &["--api-key", "sesame"]);
    let body = json!({"prompt": "Of", "max_tokens": 3}).to_string();
    for key in [None, Some("wrong")] {
        let (status, text) = server.post("/v1/completions", &body, key);
        assert_eq!(status, 401, "{text}");
        assert!(text.contains("\"authentication_error\""), "{text}");
        assert_eq!(server.get("/v1/models", key).0, 401);
        assert_eq!(server.post("/v1/attention", &body, key).0, 401);
    }
    assert_eq!(server.post("/v1/completions", &body, Some("sesame")).0, 200);
    // The scheme's case does not matter (RFC 9110); the key's does, and other schemes fail.
    for (authorization, status) in [
        ("bearer sesame", 200),
        ("BEARER  sesame ", 200),
        ("Bearer Sesame", 401),
        ("Bearer sesam", 401),
        ("Basic sesame", 401),
        ("sesame", 401),
    ] {
        let got = server.post_authorized("/v1/completions", &body, Some(authorization));
        assert_eq!(got.0, status, "{authorization:?}: {}", got.2);
    }
    assert_eq!(server.get("/v1/models", Some("sesame")).0, 200);
    // The playground and the health check need no key.
    assert_eq!(server.get("/", None).0, 200);
    assert_eq!(server.health()["api_key_required"], true);
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

/// One worker of one row and a queue of one: a third request gets 429 at once. A client that disconnects
/// stops its generation (the counter and the log say so), and the queued one then runs.
#[test]
fn burst_beyond_the_queue_gets_429_and_a_disconnect_cancels() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let server = Server::start(
        dir,
        "run",
        &[
            "--max-concurrent",
            "1",
            "--max-batch",
            "1",
            "--queue",
            "1",
            "--max-tokens",
            "10000000",
        ],
    );
    let mut running = open_stream(&server, 10_000_000);
    read_until(&mut running, "data: {");
    let mut queued = open_stream(&server, 10_000_000);
    server.wait_for("one queued", |h| h["stats"]["queued"] == 1);

    let (status, retry_after, text) = server.post_authorized(
        "/v1/completions",
        &json!({"prompt": "Of", "max_tokens": 5}).to_string(),
        None,
    );
    assert_eq!(status, 429, "{text}");
    assert_eq!(retry_after.as_deref(), Some("1"), "429 says when to retry");
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["error"]["type"], "rate_limit_error");
    assert_eq!(error["error"]["code"], "queue_full");
    assert_eq!(server.health()["stats"]["rejected"], 1);

    drop(running);
    let health = server.wait_for("the first cancelled", |h| h["stats"]["cancelled"] == 1);
    assert_eq!(health["stats"]["completed"], 0);
    read_until(&mut queued, "data: {");
    drop(queued);
    let health = server.wait_for("both cancelled, nothing running", |h| {
        h["stats"]["cancelled"] == 2 && h["stats"]["active"] == 0
    });
    // Far fewer tokens than asked for were generated.
    assert!(
        health["stats"]["tokens"].as_u64().unwrap() < 2_000_000,
        "{health}"
    );
    server.wait_for_log("cancelled after");
    // A whole (not streamed) completion is cancelled the same way.
    let body = json!({"prompt": "Of", "max_tokens": 10_000_000}).to_string();
    let mut whole = TcpStream::connect(server.host()).unwrap();
    write!(
        whole,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    server.wait_for("the whole completion running", |h| {
        h["stats"]["active"] == 1
    });
    drop(whole);
    server.wait_for("the whole completion cancelled", |h| {
        h["stats"]["cancelled"] == 3 && h["stats"]["active"] == 0
    });
    // The worker is free again.
    let (status, _) =
        server.post_json("/v1/completions", &json!({"prompt": "Of", "max_tokens": 5}));
    assert_eq!(status, 200);
}

/// Ctrl-C lets a streaming request finish, then the server exits cleanly and takes no more.
#[cfg(unix)]
#[test]
fn ctrl_c_finishes_the_requests_in_flight() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let mut server = Server::start(dir, "run", &["--max-tokens", "100000"]);
    let host = server.host().to_string();
    let mut socket = open_stream(&server, 20_000);
    read_until(&mut socket, "data: {");
    server.interrupt();
    // Read the rest while the server drains: it waits for a slow reader.
    let mut rest = String::new();
    socket.read_to_string(&mut rest).unwrap();
    let status = server.wait();
    let log = server.log.lock().unwrap().clone();
    assert!(status.success(), "{status:?}: {log}");
    assert!(
        rest.contains("\"finish_reason\":\"length\""),
        "the stream was cut: {rest:.200}"
    );
    assert!(rest.contains("data: [DONE]"));
    // The signal came while the generation ran, and the generation still finished.
    let stopping = log.find("stopping").expect("a stopping line");
    let finished = log.find("+ 20000 tokens").expect("the generation finished");
    assert!(stopping < finished, "{log}");
    assert!(
        TcpStream::connect(host).is_err(),
        "still listening after Ctrl-C"
    );
}

/// 50 clients stream at once, decoded together (4 workers' batches of up to 16, joining and
/// leaving as they come and go); each gets the text its seed gives when asked alone.
#[test]
fn fifty_concurrent_streaming_clients_get_their_own_text() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let server = Server::start(dir, "run", &["--max-concurrent", "4", "--queue", "64"]);
    let request =
        |seed: usize| json!({"prompt": "Of", "max_tokens": 40, "seed": seed, "stream": true});
    let streamed: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..50)
            .map(|seed| {
                let server = &server;
                scope.spawn(move || server.stream(&request(seed)).0)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (seed, text) in streamed.iter().enumerate() {
        let mut alone = request(seed);
        alone["stream"] = json!(false);
        let (_, completion) = server.post_json("/v1/completions", &alone);
        assert_eq!(
            text,
            completion["choices"][0]["text"].as_str().unwrap(),
            "seed {seed}"
        );
    }
    let distinct: std::collections::HashSet<_> = streamed.iter().collect();
    assert!(distinct.len() > 40, "seeds should give different texts");
    assert_eq!(server.health()["stats"]["completed"], 100);
}

/// Long prompts streamed by clients at once to one worker: each is read a chunk a step (a
/// block's worth of prompt tokens a step at most) beside the others' tokens, and each text is
/// what `tinygpt generate` writes alone, with the window sliding past block_size exactly and
/// with the context shift.
#[test]
fn long_prompts_read_beside_others_give_their_alone_text() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let block = ["--max-iters", "5", "--set", "model.block_size=320"];
    ok(train(dir, "run", &block));
    let server = Server::start(dir, "run", &["--backend", "fused", "--max-concurrent", "1"]);
    let poem = std::fs::read_to_string(corpus()).unwrap();
    let poem: String = poem.split_whitespace().collect::<Vec<_>>().join(" ");
    let cases: Vec<(String, bool)> = (0..6)
        .map(|i| {
            // 70 to 310 tokens (a character each): some past a prefill chunk of 256.
            let prompt = poem.chars().skip(i * 400).take(70 + 48 * i).collect();
            (prompt, i % 2 == 1)
        })
        .collect();
    each_streamed_at_once_is_alone(&server, dir, "fused", &cases);
}

/// Streams every `(prompt, context_shift)` of `cases` at once (seed: its index; 60 tokens at
/// temperature 0.8 from the top 20), and checks each text is what `tinygpt generate` writes
/// alone on `backend`.
fn each_streamed_at_once_is_alone(
    server: &Server,
    dir: &Path,
    backend: &str,
    cases: &[(String, bool)],
) {
    let request = |(prompt, shift): &(String, bool), seed: usize| {
        json!({"prompt": prompt, "max_tokens": 60, "temperature": 0.8, "top_k": 20,
               "seed": seed, "stream": true, "context_shift": shift})
    };
    let streamed: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(seed, case)| scope.spawn(move || server.stream(&request(case, seed)).0))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (seed, ((prompt, shift), text)) in cases.iter().zip(&streamed).enumerate() {
        let shift: &[&str] = if *shift { &["--context-shift"] } else { &[] };
        let alone = generate_alone_on(dir, backend, prompt, seed, shift);
        assert_eq!(alone, format!("{prompt}{text}\n"), "seed {seed}");
    }
}

/// On Burn's backend (flex) one worker decodes requests streamed at once in one batch too
/// (Burn's tensor ops, a row each): each text, past block_size exactly and with the context
/// shift, is what `tinygpt generate --backend flex` writes alone.
#[test]
fn burn_backend_batches_and_each_gets_its_alone_text() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let server = Server::start(dir, "run", &["--backend", "flex", "--max-concurrent", "1"]);
    let cases: Vec<(String, bool)> = ["Of", "Of Man", "And", "Th", "O", "Sing, heav"]
        .iter()
        .enumerate()
        .map(|(i, p)| (p.to_string(), i % 2 == 1))
        .collect();
    each_streamed_at_once_is_alone(&server, dir, "flex", &cases);
    let health = server.health();
    assert_eq!(health["max_batch"], 16, "{health}");
    assert_eq!(health["stats"]["completed"], 6, "{health}");
}
