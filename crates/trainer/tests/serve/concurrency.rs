//! Many clients at once: a queue that refuses at its limit, disconnects that cancel, Ctrl-C that
//! lets the requests in flight finish, and batches whose every stream gets its alone text.

use super::*;

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
