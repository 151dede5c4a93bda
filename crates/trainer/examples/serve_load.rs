//! A bounded load generator for `tinygpt serve`: CLIENTS threads each stream REQUESTS
//! completions over loopback, one after another, then it prints time to first token (p50,
//! p99), the gaps between a stream's chunks of text (p50, p99, the longest: how long a running
//! stream stalls, e.g. while others' prompts are read), tokens/s per stream and in total, and
//! stops.
//!
//!   tinygpt serve --checkpoint runs/shakespeare-char &
//!   cargo run --release --example serve_load -- --clients 8 --requests 4 --max-tokens 200

use std::io::Read;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{Value, json};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Concurrent streaming clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Requests per client, one after another.
    #[arg(long, default_value_t = 4)]
    requests: usize,
    #[arg(long, default_value_t = 200)]
    max_tokens: usize,
    #[arg(long, default_value = "\n")]
    prompt: String,
    /// Bearer token, if the server has --api-key.
    #[arg(long)]
    api_key: Option<String>,
}

/// One streamed completion: time to its first text, the gaps between its chunks of text after
/// that, its duration, its tokens.
struct Sample {
    first: Duration,
    gaps: Vec<Duration>,
    total: Duration,
    tokens: u64,
}

fn stream(args: &Args, seed: usize) -> Result<Sample, String> {
    let body = json!({
        "prompt": args.prompt, "max_tokens": args.max_tokens, "seed": seed, "temperature": 0.8,
        "stream": true, "stream_options": {"include_usage": true},
    });
    let start = Instant::now();
    let mut request = ureq::post(format!("{}/v1/completions", args.url))
        .header("Content-Type", "application/json");
    if let Some(key) = &args.api_key {
        request = request.header("Authorization", format!("Bearer {key}"));
    }
    let mut response = request.send(body.to_string()).map_err(|e| e.to_string())?;
    let mut reader = response.body_mut().as_reader();
    let (mut buffer, mut chunk) = (String::new(), [0u8; 4096]);
    let (mut first, mut tokens) = (None, 0);
    let (mut last, mut gaps) = (None, Vec::new());
    loop {
        let n = reader.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        buffer.push_str(&String::from_utf8_lossy(&chunk[..n]));
        while let Some(end) = buffer.find("\n\n") {
            let frame: String = buffer.drain(..end + 2).collect();
            let Some(data) = frame.trim().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                continue;
            }
            let event: Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
            let text = event["choices"][0]["text"].as_str();
            if text.is_some_and(|t| !t.is_empty()) {
                let now = start.elapsed();
                first.get_or_insert(now);
                if let Some(last) = last.replace(now) {
                    gaps.push(now - last);
                }
            }
            if let Some(n) = event["usage"]["completion_tokens"].as_u64() {
                tokens = n;
            }
        }
    }
    Ok(Sample {
        first: first.ok_or("no text came back")?,
        gaps,
        total: start.elapsed(),
        tokens,
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let args = Args::parse();
    let start = Instant::now();
    let results: Vec<Result<Sample, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..args.clients)
            .map(|c| {
                let args = &args;
                scope.spawn(move || {
                    (0..args.requests)
                        .map(|r| stream(args, c * args.requests + r))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let wall = start.elapsed().as_secs_f64();
    let mut samples = Vec::new();
    let mut errors = Vec::new();
    for result in results {
        match result {
            Ok(sample) => samples.push(sample),
            Err(e) => errors.push(e),
        }
    }
    if samples.is_empty() {
        eprintln!("serve_load: every request failed: {:?}", errors.first());
        std::process::exit(1);
    }
    let mut ttft: Vec<f64> = samples
        .iter()
        .map(|s| s.first.as_secs_f64() * 1e3)
        .collect();
    ttft.sort_by(f64::total_cmp);
    let mut per_stream: Vec<f64> = samples
        .iter()
        .map(|s| s.tokens as f64 / s.total.as_secs_f64())
        .collect();
    per_stream.sort_by(f64::total_cmp);
    let mut gaps: Vec<f64> = samples
        .iter()
        .flat_map(|s| s.gaps.iter().map(|g| g.as_secs_f64() * 1e3))
        .collect();
    if gaps.is_empty() {
        gaps.push(0.0); // one-token answers: no gaps
    }
    gaps.sort_by(f64::total_cmp);
    let tokens: u64 = samples.iter().map(|s| s.tokens).sum();
    println!(
        "{{\"clients\": {}, \"requests\": {}, \"errors\": {}, \"max_tokens\": {}, \"ttft_ms_p50\": {:.1}, \"ttft_ms_p99\": {:.1}, \"gap_ms_p50\": {:.1}, \"gap_ms_p99\": {:.1}, \"gap_ms_max\": {:.1}, \"stream_tokens_per_s_p50\": {:.0}, \"total_tokens_per_s\": {:.0}, \"wall_s\": {:.2}}}",
        args.clients,
        samples.len(),
        errors.len(),
        args.max_tokens,
        percentile(&ttft, 0.5),
        percentile(&ttft, 0.99),
        percentile(&gaps, 0.5),
        percentile(&gaps, 0.99),
        gaps.iter().copied().fold(0.0, f64::max),
        percentile(&per_stream, 0.5),
        tokens as f64 / wall,
        wall,
    );
}
