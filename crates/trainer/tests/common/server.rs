//! `tinygpt serve` on an ephemeral loopback port, and an HTTP client for it.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running server; killed when dropped.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// What it logged to stderr so far.
    pub log: Arc<Mutex<String>>,
    /// The thread copying stderr into `log`; it ends when the process does.
    logger: Option<std::thread::JoinHandle<()>>,
    agent: ureq::Agent,
}

impl Server {
    /// `tinygpt serve --checkpoint RUN --port 0 EXTRA…` in `dir`, once it listens.
    pub fn start(dir: &Path, run: &str, extra: &[&str]) -> Self {
        Self::start_limited(dir, run, extra, None)
    }

    /// [`Server::start`], with at most `files` open file descriptors (`RLIMIT_NOFILE`).
    pub fn start_limited(dir: &Path, run: &str, extra: &[&str], files: Option<u64>) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tinygpt"));
        command
            .args(["serve", "--checkpoint", run, "--port", "0"])
            .args(extra)
            .current_dir(dir)
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(files) = files {
            use std::os::unix::process::CommandExt;
            let limit = libc::rlimit {
                rlim_cur: files,
                rlim_max: files,
            };
            // SAFETY: setrlimit is async-signal-safe and touches only the child.
            unsafe {
                command.pre_exec(move || match libc::setrlimit(libc::RLIMIT_NOFILE, &limit) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                });
            }
        }
        let mut child = command.spawn().expect("the binary runs");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        let logger = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let url = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {first:?}; log: {}", log.lock().unwrap()))
            .to_string();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        Self {
            child,
            url,
            log,
            logger: Some(logger),
            agent,
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGINT, as Ctrl-C does.
    pub fn interrupt(&self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-INT", &pid]).status().unwrap();
        assert!(sent.success());
    }

    /// Waits for the process to end: its exit status.
    /// Waits for the process to end, and for its last log lines to reach `log`: its exit
    /// status.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        let status = self.child.wait().unwrap();
        if let Some(logger) = self.logger.take() {
            logger.join().unwrap();
        }
        status
    }

    /// Waits up to `limit` for the process to end: its exit status and how long it took, or
    /// `None` if it is still running.
    pub fn wait_within(&mut self, limit: Duration) -> Option<(std::process::ExitStatus, Duration)> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                if let Some(logger) = self.logger.take() {
                    logger.join().unwrap();
                }
                return Some((status, start.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// `host:port`.
    pub fn host(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    /// POST `body` to `path` (with `key` as a Bearer token): the status and the body.
    pub fn post(&self, path: &str, body: &str, key: Option<&str>) -> (u16, String) {
        let authorization = key.map(|key| format!("Bearer {key}"));
        let (status, _, text) = self.post_authorized(path, body, authorization.as_deref());
        (status, text)
    }

    /// POST `body` to `path` with this `Authorization` header: the status, the `Retry-After`
    /// header and the body.
    pub fn post_authorized(
        &self,
        path: &str,
        body: &str,
        authorization: Option<&str>,
    ) -> (u16, Option<String>, String) {
        let mut request = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("Content-Type", "application/json");
        if let Some(authorization) = authorization {
            request = request.header("Authorization", authorization);
        }
        let mut response = request.send(body).expect("the server answers");
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        let text = response.body_mut().read_to_string().unwrap();
        (status, retry_after, text)
    }

    pub fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.post(path, &body.to_string(), None);
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {text}"));
        (status, value)
    }

    /// GET `path`: the status, the content type and the body.
    pub fn get(&self, path: &str, key: Option<&str>) -> (u16, String, String) {
        let mut request = self.agent.get(format!("{}{path}", self.url));
        if let Some(key) = key {
            request = request.header("Authorization", format!("Bearer {key}"));
        }
        let mut response = request.call().expect("the server answers");
        let kind = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let status = response.status().as_u16();
        (status, kind, response.body_mut().read_to_string().unwrap())
    }

    pub fn health(&self) -> Value {
        let (status, _, body) = self.get("/health", None);
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// Waits (up to 30 s) until `/health` satisfies `done`.
    pub fn wait_for(&self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let health = self.health();
            if done(&health) {
                return health;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "timed out waiting for {what}: {health}\nlog:\n{}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (up to 30 s) until the server has logged a line containing `needle`: the counters
    /// of `/health` move before the line that reports the same event reaches the log.
    pub fn wait_for_log(&self, needle: &str) {
        let start = Instant::now();
        while !self.log.lock().unwrap().contains(needle) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "timed out waiting for {needle:?} in the log:\n{}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A streamed completion through the HTTP client: the text of its chunks, and its events.
    pub fn stream(&self, request: &Value) -> (String, Vec<Value>) {
        self.stream_at("/v1/completions", request)
    }

    /// A streamed request to `path`: its text (completions' `text` or chat's `delta.content`)
    /// and its chunks.
    pub fn stream_at(&self, path: &str, request: &Value) -> (String, Vec<Value>) {
        let mut response = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("Content-Type", "application/json")
            .send(request.to_string())
            .expect("the server answers");
        assert_eq!(response.status().as_u16(), 200);
        let kind = response
            .headers()
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap();
        assert_eq!(kind, "text/event-stream");
        let mut body = String::new();
        response
            .body_mut()
            .as_reader()
            .read_to_string(&mut body)
            .unwrap();
        parse_events(&body)
    }
}

/// The chunks of a server-sent event stream (which must end in `data: [DONE]`), and their text.
pub fn parse_events(body: &str) -> (String, Vec<Value>) {
    let frames: Vec<&str> = body.split("\n\n").filter(|f| !f.is_empty()).collect();
    assert_eq!(frames.last(), Some(&"data: [DONE]"), "{body}");
    let events: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(|f| serde_json::from_str(f.strip_prefix("data: ").expect("data: frames")).unwrap())
        .collect();
    let text = events
        .iter()
        .flat_map(|e| e["choices"].as_array().unwrap())
        .map(|c| {
            c["text"]
                .as_str()
                .or(c["delta"]["content"].as_str())
                .unwrap_or("")
        })
        .collect();
    (text, events)
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
