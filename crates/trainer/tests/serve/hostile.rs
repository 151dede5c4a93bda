//! Clients that flood, stall, read slowly or send too much: the server stays up and serves the
//! rest (docs/faults.md).

use super::*;

/// More connections than the server may open files: it lowers --max-connections to what
/// the descriptor limit leaves (and says so), answers the ones beyond 503 at once, closes the
/// idle ones at --header-timeout, and then serves again and stops cleanly.
#[test]
fn a_connection_flood_is_refused_at_the_limit_and_idle_ones_are_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let extra = ["--backend", "fused", "--header-timeout", "2s"];
    let mut server = Server::start_limited(dir, "run", &extra, Some(64));
    server.wait_for_log("--max-connections 1024 lowered to");
    let mut flood: Vec<TcpStream> = (0..100)
        .filter_map(|_| TcpStream::connect(server.host()).ok())
        .collect();
    assert_eq!(flood.len(), 100, "the kernel takes them all");
    let mut refused = 0;
    for socket in &mut flood {
        socket
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut answer = [0u8; 64];
        // Idle ones are closed (0 bytes) at --header-timeout, the refused ones at once.
        let n = socket.read(&mut answer).expect("closed within the timeout");
        refused += usize::from(answer[..n].starts_with(b"HTTP/1.1 503"));
    }
    assert!(refused > 0 && refused < 100, "{refused} refused");
    let health = server.wait_for("serving again", |h| h["stats"]["connections"] == 1);
    assert_eq!(health["stats"]["connections_refused"], refused);
    assert_eq!(health["stats"]["header_timeouts"], 100 - refused);
    assert!(!server.log.lock().unwrap().contains("cannot accept"));
    let (status, _) =
        server.post_json("/v1/completions", &json!({"prompt": "Of", "max_tokens": 3}));
    assert_eq!(status, 200);
    server.interrupt();
    let (status, _) = server
        .wait_within(std::time::Duration::from_secs(20))
        .expect("the server stops");
    assert!(status.success(), "{}", server.log.lock().unwrap());
}

/// Requests that arrive too slowly, or too large, are cut off instead of held: half a head is
/// closed at --header-timeout, a head over 64 KiB gets 431 (400 of them leave the server's
/// memory bounded), a body that never ends gets 408 at --body-timeout.
#[cfg(target_os = "linux")]
#[test]
fn slow_and_oversized_requests_are_cut_off() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let server = Server::start(
        dir,
        "run",
        &[
            "--backend",
            "fused",
            "--header-timeout",
            "1s",
            "--body-timeout",
            "1s",
        ],
    );
    let send = |request: &[u8]| {
        let mut socket = connected(&server);
        socket.write_all(request).unwrap();
        socket
    };
    let answer = |socket: &mut TcpStream| {
        let mut answer = Vec::new();
        let _ = socket.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    };
    let mut half = send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-");
    assert_eq!(answer(&mut half), "", "closed without an answer");
    let mut endless = send(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Transfer-Encoding: chunked\r\n\r\n5\r\n{\"pro\r\n",
    );
    assert!(answer(&mut endless).starts_with("HTTP/1.1 408"));

    let rss = || resident_kib(server.pid());
    let before = rss();
    let mut header = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
    header.resize(350 * 1024, b'a');
    let oversized: Vec<TcpStream> = (0..400)
        .map(|_| {
            let mut socket = TcpStream::connect(server.host()).unwrap();
            // The server stops reading at its limit and answers; the rest may not go in.
            let _ = socket.write_all(&header);
            socket
        })
        .collect();
    let grown = rss().saturating_sub(before);
    for mut socket in oversized {
        assert!(answer(&mut socket).starts_with("HTTP/1.1 431"));
    }
    assert!(grown < 64 * 1024, "the server grew by {grown} KiB");
    let health = server.health();
    assert_eq!(health["stats"]["header_timeouts"], 1, "{health}");
    assert_eq!(health["stats"]["body_timeouts"], 1, "{health}");
}

/// Resident memory of a process, in KiB.
#[cfg(target_os = "linux")]
fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A client that stops reading its stream cannot hold a worker: at --write-timeout its
/// connection is cut off and its generation stops, and the next request gets the worker.
#[test]
fn a_client_that_stops_reading_frees_its_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let server = Server::start(
        dir,
        "run",
        &[
            "--backend",
            "fused",
            "--max-concurrent",
            "1",
            "--max-tokens",
            "10000000",
            "--write-timeout",
            "1s",
        ],
    );
    let mut stalled = open_stream(&server, 10_000_000);
    read_until(&mut stalled, "data: {");
    let health = server.wait_for("the stalled stream cut off", |h| {
        h["stats"]["write_timeouts"] == 1 && h["stats"]["active"] == 0
    });
    assert_eq!(health["stats"]["cancelled"], 1);
    let (status, _) =
        server.post_json("/v1/completions", &json!({"prompt": "Of", "max_tokens": 5}));
    assert_eq!(status, 200);
    drop(stalled);
}

/// Clients are decoupled from decoding: two clients that open streams and stop reading fill
/// only their own buffers and sit out the steps, while a third request in the same batch is
/// answered at once, long before their write timeout; they are still held, not cut off.
#[test]
fn stalled_readers_hold_nothing_of_the_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let server = Server::start(
        dir,
        "run",
        &[
            "--backend",
            "fused",
            "--max-concurrent",
            "1",
            "--max-batch",
            "3",
            "--max-tokens",
            "100000000",
            "--write-timeout",
            "60s",
        ],
    );
    let mut stalled: Vec<_> = (0..2).map(|_| open_stream(&server, 100_000_000)).collect();
    for socket in &mut stalled {
        read_until(socket, "data: {");
    }
    // Stalled: the sockets' buffers and the streams' channels are full, no token is made.
    let last = std::cell::Cell::new(u64::MAX);
    server.wait_for("both stalled", |h| {
        let tokens = h["stats"]["tokens"].as_u64().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        last.replace(tokens) == tokens
    });
    let (status, reply) = server.post_json(
        "/v1/completions",
        &json!({"prompt": "Of", "max_tokens": 20}),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["usage"]["completion_tokens"], 20);
    // Answered while both stalled readers are still held: a request queued behind them could
    // only have been answered once their 60 s write timeout cut them off (a state, not a time).
    let health = server.health();
    assert_eq!(
        (
            &health["stats"]["active"],
            &health["stats"]["write_timeouts"]
        ),
        (&json!(2), &json!(0)),
        "{health}"
    );
    drop(stalled);
    server.wait_for("the stalled ones cancelled", |h| {
        h["stats"]["cancelled"] == 2 && h["stats"]["active"] == 0
    });
}

/// An idle server whose `auto` backend settled on the CPU uses no CPU: the software Vulkan it
/// looked at on the way is not left running.
#[cfg(target_os = "linux")]
#[test]
fn an_idle_server_uses_no_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let server = Server::start(dir, "run", &["--backend", "auto"]);
    let ticks = || {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", server.pid())).unwrap();
        // Fields after the command's closing parenthesis; utime and stime are 14th and 15th.
        let fields: Vec<u64> = stat[stat.rfind(')').unwrap() + 2..]
            .split(' ')
            .skip(11)
            .take(2)
            .map(|f| f.parse().unwrap())
            .collect();
        fields[0] + fields[1]
    };
    // The server answers before the software Vulkan it looked at has wound down, later on a
    // busy machine: it must settle, within a few windows of 4 s, to at most 4 ticks (10 ms
    // each: 1% of a core) in a window. A server that keeps a thread spinning never does.
    server.health();
    let mut used = Vec::new();
    for _ in 0..5 {
        let before = ticks();
        std::thread::sleep(std::time::Duration::from_secs(4));
        used.push(ticks() - before);
        if used.last() <= Some(&4) {
            return;
        }
    }
    panic!("idle, it used {used:?} ticks of CPU in successive windows of 4 s");
}

/// A `Content-Length` beyond `--max-body-bytes` is answered 413 at once, without waiting for a
/// body that may never come.
#[test]
fn an_oversized_declared_body_is_refused_before_it_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let server = Server::start(dir, "run", &["--backend", "fused"]);
    let mut socket = connected(&server);
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: 10000000000\r\n\r\n"
    )
    .unwrap();
    let mut answer = [0u8; 512];
    let n = socket.read(&mut answer).expect("an answer before any body");
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}

/// A body a little over `--max-body-bytes`, sent whole after a pause, as a client that writes
/// its request before reading does: its 413 arrives, and the connection stays open for the
/// next request. (A server that answered at once and closed with the body still arriving
/// would reset the connection, and the client could see that instead of the 413, or find its
/// kept-alive connection dead at the next request.)
#[test]
fn a_body_over_the_limit_gets_its_413_and_the_connection_stays_usable() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let args = ["--backend", "fused", "--max-body-bytes", "2000"];
    let server = Server::start(dir, "run", &args);
    let mut socket = connected(&server);
    let body = "x".repeat(3000);
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    socket.write_all(body.as_bytes()).unwrap();
    let answer = read_until(&mut socket, "limit of 2000 bytes");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    write!(socket, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    // After whatever of the 413's body was not read yet (a closed connection panics in
    // `read_until`, one that answers otherwise at the socket's read timeout).
    read_until(&mut socket, "HTTP/1.1 200");
}

/// A client that never finishes its request cannot hold shutdown: at `--shutdown-timeout`,
/// or at a second Ctrl-C, the server closes what is left and exits 0.
#[test]
fn a_stalled_client_cannot_hold_shutdown() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let stall = |server: &Server| {
        let mut socket = TcpStream::connect(server.host()).unwrap();
        write!(
            socket,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-"
        )
        .unwrap();
        socket
    };
    let mut server = Server::start(
        dir,
        "run",
        &["--backend", "fused", "--shutdown-timeout", "2s"],
    );
    let _held = stall(&server);
    server.wait_for("the connection is open", |h| h["status"] == "ok");
    server.interrupt();
    let (status, took) = server
        .wait_within(std::time::Duration::from_secs(20))
        .expect("the server stopped at its --shutdown-timeout");
    assert!(status.success(), "{}", server.log.lock().unwrap());
    assert!(
        took.as_secs_f64() >= 1.5,
        "it waited {took:?}, not the 2 s it was given"
    );
    assert!(
        server
            .log
            .lock()
            .unwrap()
            .contains("--shutdown-timeout reached")
    );

    let mut server = Server::start(
        dir,
        "run",
        &["--backend", "fused", "--shutdown-timeout", "10m"],
    );
    let _held = stall(&server);
    server.wait_for("the connection is open", |h| h["status"] == "ok");
    server.interrupt();
    server.wait_for_log("serve: stopping");
    server.interrupt();
    let (status, _) = server
        .wait_within(std::time::Duration::from_secs(20))
        .expect("a second Ctrl-C stops the server at once");
    assert!(status.success(), "{}", server.log.lock().unwrap());
}
