//! The playground in a real browser: headless Chromium driven through the DevTools protocol.
//! It loads the page, generates, sees the text stream in (equal to the API's for the same
//! seed), clicks a token, sees the heatmaps drawn, checks a phone-sized screen, and saves a
//! screenshot whose path it prints; and `tinygpt watch` following a run as it trains.
//!
//! Chromium: `TINYGPT_CHROMIUM`, else `chromium` or `chromium-browser` on the PATH, found when
//! the tests are built. Without one the tests are reported as ignored, except under CI (`CI`
//! set), where they fail.

mod common;

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::server::Server;
use common::*;
use serde_json::{Value, json};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// The browser the build found (`crates/test-needs.rs`). The tests that call this are ignored
/// on a machine without one (never under CI), so reaching here without one is a failure.
fn chromium_or_fail() -> PathBuf {
    match env!("TINYGPT_TEST_CHROMIUM") {
        "" => panic!(
            "no chromium when the tests were built: install Debian's chromium package (or set \
             TINYGPT_CHROMIUM) and rebuild"
        ),
        path => PathBuf::from(path),
    }
}

/// Headless Chromium and a DevTools session on its first page.
struct Browser {
    child: Child,
    page: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn launch(binary: &Path) -> Self {
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--remote-debugging-port=0",
                "--window-size=1200,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chromium starts");
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let port = loop {
            line.clear();
            assert!(stderr.read_line(&mut line).unwrap() > 0, "chromium exited");
            if let Some(rest) = line.trim().strip_prefix("DevTools listening on ws://") {
                let host = rest.split('/').next().unwrap();
                break host.rsplit(':').next().unwrap().to_string();
            }
        };
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        let mut list = ureq::get(format!("http://127.0.0.1:{port}/json/list"))
            .call()
            .unwrap();
        let targets: Value =
            serde_json::from_str(&list.body_mut().read_to_string().unwrap()).unwrap();
        let page = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .expect("a page target");
        let (page, _) =
            tungstenite::connect(page["webSocketDebuggerUrl"].as_str().unwrap()).unwrap();
        Self {
            child,
            page,
            next_id: 0,
            _profile: profile,
        }
    }

    /// Sends a DevTools command and waits for its result (events in between are skipped).
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let message = json!({"id": id, "method": method, "params": params}).to_string();
        self.page.send(Message::text(message)).unwrap();
        loop {
            let reply = self.page.read().unwrap();
            let Ok(text) = reply.to_text() else { continue };
            let reply: Value = serde_json::from_str(text).unwrap();
            if reply["id"] == id {
                assert!(reply["error"].is_null(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression (promises awaited), or the exception it threw.
    fn try_eval(&mut self, expression: &str) -> Result<Value, Value> {
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        match result["exceptionDetails"].is_null() {
            true => Ok(result["result"]["value"].clone()),
            false => Err(result),
        }
    }

    fn eval(&mut self, expression: &str) -> Value {
        self.try_eval(expression)
            .unwrap_or_else(|e| panic!("{expression}: {e}"))
    }

    /// Waits (up to 60 s) until `expression` is true; until then it may throw (the page may
    /// still be loading).
    fn wait_until(&mut self, what: &str, expression: &str) {
        let start = Instant::now();
        while self.try_eval(expression) != Ok(json!(true)) {
            let error = self.try_eval("document.getElementById('error').textContent");
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "timed out waiting for {what} (page error: {error:?})"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn screenshot(&mut self, path: &Path) {
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = data_encoding::BASE64
            .decode(shot["data"].as_str().unwrap().as_bytes())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"));
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
#[cfg_attr(
    no_chromium,
    ignore = "no chromium on this machine (install it or set TINYGPT_CHROMIUM, then rebuild)"
)]
fn playground_generates_and_draws_attention_in_a_browser() {
    let binary = chromium_or_fail();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // A run of your own for a nicer screenshot: TINYGPT_PLAYGROUND_RUN=DIR.
    let (run, prompt, max_tokens) = match std::env::var("TINYGPT_PLAYGROUND_RUN") {
        Ok(run) => (run, "Of Man's first disobedience", 160),
        Err(_) => {
            let args = ["--max-iters", "20", "--set", "train.learning_rate=1e-2"];
            ok(train(dir, "run", &args));
            ("run".to_string(), "Of Man", 12)
        }
    };
    let server = Server::start(dir, &run, &[]);
    let mut browser = Browser::launch(&binary);
    browser.call("Page.enable", json!({}));
    browser.call("Page.navigate", json!({"url": format!("{}/", server.url)}));
    browser.wait_until(
        "the model info",
        "document.getElementById('layer').options.length > 0",
    );
    let info = browser.eval("document.getElementById('model-info').textContent");
    assert!(info.as_str().unwrap().contains("block_size"), "{info}");
    let key_field = browser.eval("getComputedStyle(document.getElementById('key-label')).display");
    assert_eq!(
        key_field, "none",
        "no API key field when the server needs none"
    );

    // Generate: the text streams into the page, equal to the API's for the same settings.
    browser.eval(&format!(
        "document.getElementById('prompt').value = {prompt:?};
         document.getElementById('seed').value = '7';
         document.getElementById('max_tokens').value = '{max_tokens}';
         document.getElementById('generate').click(); true"
    ));
    browser.wait_until(
        "the generated text and the heatmaps",
        "document.getElementById('status').textContent.includes('tokens in') &&
         document.getElementById('heatmaps').dataset.drawn !== undefined",
    );
    let shown = browser.eval("document.getElementById('out-text').textContent");
    let (_, api) = server.post_json(
        "/v1/completions",
        &json!({"prompt": prompt, "seed": 7, "max_tokens": max_tokens, "temperature": 0.8,
                "top_k": 200, "top_p": 1, "repetition_penalty": 1}),
    );
    assert_eq!(shown, api["choices"][0]["text"]);
    assert!(!shown.as_str().unwrap().is_empty());

    // Click a token: it is focused, the earlier tokens are shaded by its weights, the later
    // ones are marked as masked.
    browser.eval("document.querySelector('#tokens span[data-i=\"3\"]').click(); true");
    let focus = browser.eval("document.getElementById('focus').textContent");
    assert!(focus.as_str().unwrap().starts_with("token 3 "), "{focus}");
    let shading = browser.eval(
        "[...document.querySelectorAll('#tokens span')].map(s =>
           s.classList.contains('future') ? 'future' : (s.style.background ? 'shaded' : 'plain'))",
    );
    let shading: Vec<&str> = shading
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(&shading[..4], ["shaded"; 4], "{shading:?}");
    assert!(shading[4..].iter().all(|s| *s == "future"), "{shading:?}");

    // One head: one heatmap with coloured cells below the diagonal and none above it.
    browser.eval(
        "const h = document.getElementById('head'); h.value = '1';
         h.dispatchEvent(new Event('change')); true",
    );
    assert_eq!(
        browser.eval("document.getElementById('heatmaps').dataset.drawn"),
        "1"
    );
    let pixels = browser.eval(
        "(() => { const c = document.querySelector('#heatmaps canvas');
           const n = document.querySelectorAll('#tokens span').length;
           const cell = c.width / n, d = c.getContext('2d');
           const at = (q, k) => Array.from(d.getImageData(k * cell + cell / 2, q * cell + cell / 2, 1, 1).data);
           const white = (p) => p[0] === 255 && p[1] === 255 && p[2] === 255;
           let coloured = [0, 0];
           for (let q = 0; q < n; q++)
             for (let k = 0; k < n; k++) if (!white(at(q, k))) coloured[k > q ? 1 : 0]++;
           let rows = 0;
           for (let q = 0; q < n; q++) if ([...Array(q + 1).keys()].some((k) => !white(at(q, k)))) rows++;
           return { n, rows, below: coloured[0], above: coloured[1], diagonal: at(0, 0) }; })()",
    );
    assert_eq!(pixels["above"], 0, "masked cells stay white: {pixels}");
    assert_eq!(
        pixels["rows"], pixels["n"],
        "every row has weight somewhere: {pixels}"
    );
    assert_eq!(
        pixels["diagonal"],
        json!([0, 0, 255, 255]),
        "token 0 attends only to itself"
    );

    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("playground.png");
    browser.screenshot(&path);
    println!("screenshot: {}", path.display());

    // A phone-sized screen: nothing wider than the screen.
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": true}),
    );
    let width = browser.eval("document.documentElement.scrollWidth");
    assert!(
        width.as_u64().unwrap() <= 390,
        "the page is {width} px wide on a 390 px screen"
    );
    let phone = path.with_file_name("playground-phone.png");
    browser.screenshot(&phone);
    println!("screenshot: {}", phone.display());
}

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `tinygpt watch RUNS --port 0` in `dir`, once it listens, and its address.
fn start_watch(dir: &Path, runs: &[&str]) -> (Killed, String) {
    let mut watch = Command::new(env!("CARGO_BIN_EXE_tinygpt"))
        .args(["watch", "--port", "0"])
        .args(runs)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(watch.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_string();
    (Killed(watch), url)
}

/// `tinygpt watch` in a real browser: a run still training and a finished one plot together,
/// a new point arrives while the page is open, and the slider across evaluations changes the
/// attention heatmap's pixels.
#[test]
#[cfg_attr(
    no_chromium,
    ignore = "no chromium on this machine (install it or set TINYGPT_CHROMIUM, then rebuild)"
)]
fn watch_follows_a_run_as_it_trains() {
    let binary = chromium_or_fail();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let every = [
        "--set",
        "train.log_interval=2",
        "--set",
        "train.eval_interval=10",
    ];
    ok(train(
        dir,
        "done",
        &[&["--max-iters", "40"][..], &every].concat(),
    ));
    let corpus = corpus();
    let mut live = vec!["train", "--data", corpus.to_str().unwrap(), "--out", "live"];
    live.extend(TINY);
    live.extend(["--max-iters", "100000000", "--backend", "flex"]);
    live.extend(every);
    let _live = Killed(
        Command::new(env!("CARGO_BIN_EXE_tinygpt"))
            .args(&live)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (_watch, url) = start_watch(dir, &["live", "done"]);

    let mut browser = Browser::launch(&binary);
    browser.call("Page.enable", json!({}));
    browser.call("Page.navigate", json!({"url": url}));
    browser.wait_until(
        "both runs on the chart",
        "document.getElementById('loss').dataset.runs === '2'",
    );
    let points = browser.eval("Number(document.getElementById('loss').dataset.points)");
    browser.wait_until(
        "a new point from the run still training",
        &format!("Number(document.getElementById('loss').dataset.points) > {points}"),
    );

    // The finished run's attention: the first and the last evaluation differ in pixels.
    let pixels = "(() => { const c = document.getElementById('heatmap');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let h = 0; for (let i = 0; i < d.length; i += 4) h = (h * 31 + d[i]) % 1000000007;
        return c.dataset.drawn + ' ' + h; })()";
    browser.eval(
        "{ const r = document.getElementById('att-run'); r.value = '1';
           r.dispatchEvent(new Event('change')); } true",
    );
    browser.wait_until(
        "the finished run's heatmap",
        "(document.getElementById('heatmap').dataset.drawn || '').startsWith('40/')",
    );
    let last = browser.eval(pixels);
    browser.eval(
        "{ const s = document.getElementById('eval'); s.value = '0';
           s.dispatchEvent(new Event('input')); } true",
    );
    browser.wait_until(
        "the heatmap at step 0",
        "document.getElementById('heatmap').dataset.drawn.startsWith('0/')",
    );
    let first = browser.eval(pixels);
    let hash = |v: &Value| v.as_str().unwrap().split(' ').nth(1).unwrap().to_string();
    assert_ne!(hash(&first), hash(&last), "{first} vs {last}");
    let samples = browser.eval("document.querySelectorAll('#samples .sample').length");
    assert!(samples.as_u64().unwrap() >= 1, "{samples}");

    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("watch.png");
    browser.eval(
        "{ const s = document.getElementById('eval'); s.value = s.max;
           s.dispatchEvent(new Event('input')); } true",
    );
    browser.screenshot(&path);
    println!("screenshot: {}", path.display());
    // Runs of your own for a nicer screenshot: TINYGPT_WATCH_RUNS="runs/a runs/b".
    if let Ok(runs) = std::env::var("TINYGPT_WATCH_RUNS") {
        let runs: Vec<&str> = runs.split_whitespace().collect();
        let (_own, url) = start_watch(dir, &runs);
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 1200, "height": 1180, "deviceScaleFactor": 1, "mobile": false}),
        );
        browser.call("Page.navigate", json!({"url": url}));
        browser.wait_until(
            "the runs' samples",
            "document.querySelectorAll('#samples .sample').length > 0",
        );
        browser.eval(
            "{ const h = document.getElementById('layer'); h.value = '1';
               h.dispatchEvent(new Event('change')); } true",
        );
        std::thread::sleep(Duration::from_millis(300));
        let own_path = path.with_file_name("watch-runs.png");
        browser.screenshot(&own_path);
        println!("screenshot: {}", own_path.display());
        browser.call("Emulation.clearDeviceMetricsOverride", json!({}));
    }
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": true}),
    );
    let width = browser.eval("document.documentElement.scrollWidth");
    assert!(
        width.as_u64().unwrap() <= 390,
        "the page is {width} px wide on a 390 px screen"
    );
}
