//! `--weights q8_0`, `q5_0` and `q4_0`: a trained run sampled, scored and benchmarked with
//! int8, five- or four-bit matrices on the fused CPU decoder, close to f32; asked of another backend, one
//! line and a non-zero exit.

use super::common::*;

/// The `loss N` field of an `eval` line.
fn loss(eval: &str) -> f64 {
    let part = eval
        .split(" | ")
        .find(|p| p.starts_with("loss "))
        .unwrap_or_else(|| panic!("{eval}"));
    part[5..].trim().parse().unwrap()
}

#[test]
fn quantised_weights_sample_score_and_bench_close_to_f32() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let extra = ["--max-iters", "40", "--set", "train.learning_rate=1e-2"];
    ok(train(dir, "run", &extra));
    let generate = |weights: &str| {
        ok(tinygpt(
            dir,
            &[
                "generate",
                "--checkpoint",
                "run",
                "--prompt",
                "Of Man",
                "--temperature",
                "0",
                "--max-new-tokens",
                "40",
                "--backend",
                "fused",
                "--weights",
                weights,
            ],
        ))
    };
    let f32s = generate("f32");
    for int8 in [generate("q8_0"), generate("q5_0"), generate("q4_0")] {
        assert!(int8.starts_with("Of Man"), "{int8}");
        assert_eq!(
            int8.chars().count(),
            f32s.chars().count(),
            "{int8:?} vs {f32s:?}"
        );
    }

    let eval = |weights: &str| {
        ok(tinygpt(
            dir,
            &[
                "eval",
                "--checkpoint",
                "run",
                "--backend",
                "fused",
                "--weights",
                weights,
            ],
        ))
    };
    let (f32_eval, int8_eval) = (eval("f32"), eval("q8_0"));
    assert!(int8_eval.contains("q8_0"), "{int8_eval}");
    let (a, b) = (loss(&f32_eval), loss(&int8_eval));
    assert!(
        (a - b).abs() < 0.02 * a,
        "f32 {f32_eval} vs int8 {int8_eval}"
    );
    let four_eval = eval("q4_0");
    assert!(four_eval.contains("q4_0 matrices"), "{four_eval}");
    let c = loss(&four_eval);
    assert!(
        (a - c).abs() < 0.05 * a && c != a,
        "f32 {f32_eval} vs four bits {four_eval}"
    );
    let five_eval = eval("q5_0");
    assert!(five_eval.contains("q5_0 matrices"), "{five_eval}");
    let f = loss(&five_eval);
    assert!(
        (a - f).abs() < 0.03 * a && f != a,
        "f32 {f32_eval} vs five bits {five_eval}"
    );

    let bench = |weights: &str| -> serde_json::Value {
        let out = ok(tinygpt(
            dir,
            &[
                "bench",
                "--config",
                "baby",
                "--iters",
                "0",
                "--sample-tokens",
                "20",
                "--json",
                "--weights",
                weights,
            ],
        ));
        serde_json::from_str(out.lines().last().unwrap()).unwrap()
    };
    let (f32_bench, int8_bench) = (bench("f32"), bench("q8_0"));
    assert_eq!(int8_bench["weights"], "q8_0");
    let bytes = |v: &serde_json::Value| v["weight_bytes_per_token"].as_u64().unwrap();
    // 34 bytes per 32 weights against 128; 22 in five bits, 18 in four.
    assert_eq!(
        bytes(&int8_bench) * 128,
        bytes(&f32_bench) * 34,
        "{int8_bench}"
    );
    let four_bench = bench("q4_0");
    assert_eq!(four_bench["weights"], "q4_0");
    assert_eq!(bytes(&four_bench) * 128, bytes(&f32_bench) * 18);
    let five_bench = bench("q5_0");
    assert_eq!(five_bench["weights"], "q5_0");
    assert_eq!(bytes(&five_bench) * 128, bytes(&f32_bench) * 22);
}

#[test]
fn quantised_weights_elsewhere_are_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(dir, "run", &["--max-iters", "2"]));
    for (command, weights) in ["generate", "eval", "serve"]
        .into_iter()
        .flat_map(|c| [(c, "q8_0"), (c, "q5_0"), (c, "q4_0")])
    {
        let args = [
            command,
            "--checkpoint",
            "run",
            "--backend",
            "flex",
            "--weights",
            weights,
        ];
        let why = format!("--weights {weights} runs on the fused CPU decoder only");
        fails(tinygpt(dir, &args), &why);
    }
}

/// Half-precision matrices are Burn's decoder's (a GPU, or flex): asked of the fused CPU
/// decoder they are one line, never a silent f32; on flex they sample and score.
#[test]
fn half_weights_on_the_fused_decoder_are_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(dir, "run", &["--max-iters", "2"]));
    let why = "--weights bf16 samples on a GPU";
    for command in ["generate", "serve"] {
        let args = [
            command,
            "--checkpoint",
            "run",
            "--backend",
            "fused",
            "--weights",
            "bf16",
        ];
        fails(tinygpt(dir, &args), why);
    }
    let eval = |weights: &str| {
        let args = [
            "eval",
            "--checkpoint",
            "run",
            "--backend",
            "flex",
            "--weights",
            weights,
        ];
        ok(tinygpt(dir, &args))
    };
    let (f32s, bf16) = (eval("f32"), eval("bf16"));
    assert!(bf16.contains("with bf16 matrices"), "{bf16}");
    let loss = |out: &str| -> f32 {
        let after = out.split("| loss ").nth(1).expect("a loss");
        after.split_whitespace().next().unwrap().parse().unwrap()
    };
    let (a, b) = (loss(&f32s), loss(&bf16));
    assert!((a - b).abs() < 0.02 * a, "f32 {a} against bf16 {b}");
}
