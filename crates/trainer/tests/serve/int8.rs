//! `serve --weights q8_0`: the server's batched int8 decoder gives each request what
//! `generate --weights q8_0` gives it alone, with other requests decoding beside it.

use super::*;

#[test]
fn int8_completions_equal_int8_generate() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let int8 = ["--weights", "q8_0"];
    let server = Server::start(dir, "run", &["--backend", "fused", "--weights", "q8_0"]);
    let request = |prompt: &str, seed: usize| {
        json!({
            "model": "anything", "prompt": prompt, "max_tokens": 60, "temperature": 0.8,
            "top_k": 20, "seed": seed,
        })
    };
    let prompts = [("Of Man", 7), ("And so", 8), ("The king", 9)];
    let completions: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|&(prompt, seed)| {
                let server = &server;
                scope.spawn(move || server.post_json("/v1/completions", &request(prompt, seed)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap().1).collect()
    });
    for ((prompt, seed), completion) in prompts.iter().zip(&completions) {
        let alone = generate_alone(dir, prompt, *seed, &int8);
        assert_eq!(
            alone,
            format!("{prompt}{}\n", text(completion)),
            "{completion}"
        );
    }
    // The weights were int8: the same request's log-probabilities differ from an f32
    // server's (the sampled text may not: small differences rarely move a draw).
    let logprobs = |server: &Server| {
        let mut scored = request("Of Man", 7);
        scored["logprobs"] = json!(1);
        let (status, completion) = server.post_json("/v1/completions", &scored);
        assert_eq!(status, 200, "{completion}");
        completion["choices"][0]["logprobs"]["token_logprobs"].clone()
    };
    let f32_server = Server::start(dir, "run", &["--backend", "fused"]);
    assert_ne!(logprobs(&server), logprobs(&f32_server));
}

/// `serve --weights file` of a run imported from a Q5_0 file (loaded without the matrices the
/// file's blocks give, its embedding looked up in them) answers as `generate --weights q5_0` of
/// the same run (the whole model loaded, the same blocks quantised again from its values).
#[test]
fn a_files_own_blocks_serve_as_generate_decodes_them() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let export = [
        "export",
        "--checkpoint",
        "run",
        "--which",
        "last",
        "--format",
        "gguf",
        "--dtype",
        "q5_0",
        "--pure",
        "--out",
        "q5.gguf",
    ];
    ok(tinygpt(dir, &export));
    std::fs::rename(dir.join("run"), dir.join("trained")).unwrap();
    ok(tinygpt(
        dir,
        &["import", "--from", "q5.gguf", "--out", "run"],
    ));
    let server = Server::start(dir, "run", &["--backend", "fused", "--weights", "file"]);
    let request = json!({
        "model": "anything", "prompt": "Of Man", "max_tokens": 60, "temperature": 0.8,
        "top_k": 20, "seed": 7,
    });
    let (status, completion) = server.post_json("/v1/completions", &request);
    assert_eq!(status, 200, "{completion}");
    let alone = generate_alone(dir, "Of Man", 7, &["--weights", "q5_0"]);
    assert_eq!(alone, format!("Of Man{}\n", text(&completion)));
}
