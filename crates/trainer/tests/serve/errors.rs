//! Requests the server refuses: OpenAI's error shape for every bad request, and the API key.

use super::*;

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
