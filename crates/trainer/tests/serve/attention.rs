//! `POST /v1/attention`: causal rows that sum to one, one layer and head as a slice of all,
//! truncation, and the size cap (`--max-attention-weights`) that keeps a request for every
//! layer of a long prompt from taking gigabytes.

use super::*;

/// The attention route: the causal rows of every layer and head, each summing to 1; one layer
/// and head is the same slice; a long prompt is truncated to its last block_size tokens.
#[test]
fn attention_route_gives_causal_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let server = Server::start(dir, "run", &[]);
    let (status, all) = server.post_json("/v1/attention", &json!({"prompt": "Of Man"}));
    assert_eq!(status, 200, "{all}");
    assert_eq!(all["tokens"], json!(["O", "f", " ", "M", "a", "n"]));
    assert_eq!(all["layers"], json!([0]));
    assert_eq!(all["heads"], json!([0, 1]));
    for head in all["attention"][0].as_array().unwrap() {
        let rows = head.as_array().unwrap();
        assert_eq!(rows.len(), 6);
        for (q, row) in rows.iter().enumerate() {
            let row: Vec<f64> = row
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_f64().unwrap())
                .collect();
            assert_eq!(row.len(), q + 1, "row {q} holds keys 0..={q} only");
            assert!(
                (row.iter().sum::<f64>() - 1.0).abs() < 1e-3,
                "row {q}: {row:?}"
            );
        }
        assert_eq!(
            rows[0],
            json!([1.0]),
            "the first token can only attend to itself"
        );
    }
    let (_, one) = server.post_json(
        "/v1/attention",
        &json!({"prompt": "Of Man", "layer": 0, "head": 1}),
    );
    assert_eq!(one["attention"][0][0], all["attention"][0][1]);
    let long = "Of Man's first disobedience";
    let (status, cut) =
        server.post_json("/v1/attention", &json!({"prompt": long, "truncate": true}));
    assert_eq!(status, 200, "{cut}");
    assert_eq!(cut["truncated"], 27 - 16);
    let tokens: String = cut["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens, &long[11..]);
}

/// A request whose maps would pass `--max-attention-weights` gets a 400 that says how to ask
/// for less: on the fused decoder one layer (it computes only that one), then a shorter
/// prompt; on Burn's forward (flex), which computes every layer, a shorter prompt. What fits
/// is answered.
#[test]
fn attention_beyond_the_cap_is_refused_with_what_fits() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(
        dir,
        "run",
        &["--max-iters", "2", "--set", "model.n_layer=2"],
    ));
    let prompt = "Of Man's first d"; // 16 tokens: 2 heads × 16² = 512 weights a layer
    let refused = |server: &Server, body: Value, param: &str, says: &str| {
        let (status, error) = server.post_json("/v1/attention", &body);
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["error"]["param"], param, "{error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
        assert!(message.contains("--max-attention-weights"), "{message}");
    };
    let answered = |server: &Server, body: Value| {
        let (status, maps) = server.post_json("/v1/attention", &body);
        assert_eq!(status, 200, "{body}: {maps}");
    };
    let start = |backend: &str, cap: &str| {
        Server::start(
            dir,
            "run",
            &["--backend", backend, "--max-attention-weights", cap],
        )
    };
    // The first `tokens` of the prompt, for one layer or all.
    let ask = |layer: Option<usize>, tokens: usize| match layer {
        Some(layer) => json!({"prompt": &prompt[..tokens], "layer": layer}),
        None => json!({"prompt": &prompt[..tokens]}),
    };
    let fused = start("fused", "600");
    refused(&fused, ask(None, 16), "layer", "ask for one `layer`");
    answered(&fused, ask(Some(1), 16));
    drop(fused);
    // 300 / 2 heads = 150 ≥ 12², < 13².
    let fused = start("fused", "300");
    refused(&fused, ask(Some(1), 16), "prompt", "at most 12 tokens");
    answered(&fused, ask(Some(1), 12));
    drop(fused);
    // Burn's forward makes both layers: 600 / 4 = 150.
    let flex = start("flex", "600");
    refused(&flex, ask(Some(1), 16), "prompt", "at most 12 tokens");
    answered(&flex, ask(None, 12));
}
