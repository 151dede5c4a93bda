//! What runs leave behind and what other tools read: documents and BPE, attention maps, the
//! step journal, bench's figures (export and import: `exports.rs`).

use super::*;

#[test]
fn documents_batching_and_bpe_train() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Stanzas separated by blank lines: each is a document, padded in the batch.
    let text = std::fs::read_to_string(corpus()).unwrap();
    let docs: String = text
        .lines()
        .take(2000)
        .collect::<Vec<_>>()
        .chunks(4)
        .map(|c| c.join("\n"))
        .collect::<Vec<_>>()
        .join("\n\n");
    std::fs::write(dir.join("stanzas.txt"), docs).unwrap();
    let mut args = vec![
        "train",
        "--data",
        "stanzas.txt",
        "--out",
        "docs",
        "--backend",
        "flex",
        "--max-iters",
        "10",
    ];
    args.extend(TINY);
    args.extend([
        "--set",
        "data.batching=documents",
        "--set",
        "data.tokenizer=bpe",
        "--set",
        "data.bpe_vocab_size=300",
    ]);
    let log = ok(tinygpt(dir, &args));
    assert!(
        log.contains("bpe (byte-level) tokenizer, vocab 300"),
        "{log}"
    );
    let rows = metrics(&dir.join("docs"));
    assert!(
        rows.iter().all(|r| r.1.is_finite() && r.2.is_finite()),
        "{rows:?}"
    );
    // Byte-level BPE encodes characters it never saw, so any prompt works.
    let out = ok(tinygpt(
        dir,
        &[
            "generate",
            "--checkpoint",
            "docs",
            "--prompt",
            "Zebra ✓",
            "--max-new-tokens",
            "5",
            "--backend",
            "flex",
        ],
    ));
    assert!(out.starts_with("Zebra ✓"), "{out}");
    let eval = ok(tinygpt(
        dir,
        &["eval", "--checkpoint", "docs", "--backend", "flex"],
    ));
    assert!(eval.contains("bits per byte"), "{eval}");
}

/// The matrices `tinygpt attention` printed: (layer, head, rows of numbers).
fn printed_matrices(out: &str) -> Vec<(String, Vec<Vec<f64>>)> {
    let mut matrices = Vec::new();
    let mut lines = out.lines().peekable();
    while let Some(line) = lines.next() {
        if !line.starts_with("layer ") {
            continue;
        }
        lines.next(); // column labels
        let mut rows = Vec::new();
        while let Some(row) = lines.peek() {
            let numbers: Vec<f64> = row
                .split_whitespace()
                .skip(1)
                .filter_map(|w| w.parse().ok())
                .collect();
            if numbers.is_empty() {
                break;
            }
            rows.push(numbers);
            lines.next();
        }
        matrices.push((line.to_string(), rows));
    }
    matrices
}

#[test]
fn attention_maps_of_a_trained_model() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(dir, "run", &["--max-iters", "10"]));
    let out = ok(tinygpt(
        dir,
        &[
            "attention",
            "--checkpoint",
            "run",
            "--prompt",
            "Of Man",
            "--decimals",
            "4",
            "--backend",
            "flex",
        ],
    ));
    let matrices = printed_matrices(&out);
    assert_eq!(matrices.len(), 2, "1 layer x 2 heads:\n{out}");
    for (title, rows) in &matrices {
        assert_eq!(rows.len(), 6, "{title}:\n{out}");
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(row.len(), 6, "{title}:\n{out}");
            let sum: f64 = row.iter().sum();
            assert!((sum - 1.0).abs() < 6e-4, "{title} row {i} sums to {sum}");
            assert!(
                row[i + 1..].iter().all(|&w| w == 0.0),
                "{title} row {i} sees the future: {row:?}"
            );
        }
        // Row 0 can only attend to itself.
        assert_eq!(rows[0][0], 1.0);
    }
    assert!(
        out.contains("     O      f      ␣      M      a      n"),
        "token labels:\n{out}"
    );
    for file in [
        "attention.svg",
        "attention-L0-H0.svg",
        "attention-L0-H1.svg",
    ] {
        let svg = std::fs::read_to_string(dir.join("run/attention").join(file)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("<rect"), "{file}");
    }
    let one = ok(tinygpt(
        dir,
        &[
            "attention",
            "--checkpoint",
            "run",
            "--prompt",
            "Of",
            "--head",
            "1",
            "--backend",
            "flex",
        ],
    ));
    assert_eq!(printed_matrices(&one).len(), 1);
    fails(
        tinygpt(
            dir,
            &[
                "attention",
                "--checkpoint",
                "run",
                "--prompt",
                "Of",
                "--layer",
                "3",
            ],
        ),
        "--layer 3 does not exist",
    );
    let long = "a".repeat(17);
    fails(
        tinygpt(
            dir,
            &["attention", "--checkpoint", "run", "--prompt", &long],
        ),
        "17 tokens but the model's block_size is 16",
    );
}

/// A run keeps a journal for watching it learn: a line per logged step in `steps.csv`, and per
/// evaluation a sample and the attention of the fixed prompt in `evals.jsonl`; `loss.svg`
/// draws both. A prompt the tokenizer cannot write is a one-line error.
#[test]
fn a_run_journals_its_steps_and_evaluations() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let args = ["--max-iters", "20", "--set", "train.log_interval=5"];
    ok(train(dir, "run", &args));
    let steps = std::fs::read_to_string(dir.join("run/steps.csv")).unwrap();
    let lines: Vec<&str> = steps.lines().collect();
    assert_eq!(
        lines[0],
        "step,loss,lr,grad_norm,tokens_per_s,skipped_steps,elapsed_s"
    );
    let logged: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split(',').next().unwrap())
        .collect();
    assert_eq!(logged, ["5", "10", "15", "20"], "{steps}");
    let evals: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("run/evals.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let at: Vec<u64> = evals.iter().map(|e| e["step"].as_u64().unwrap()).collect();
    assert_eq!(at, [0, 5, 10, 15, 20]);
    for eval in &evals {
        // TINY: block_size 16 (the prompt), 1 layer of 2 heads, 8 sampled tokens.
        assert_eq!(eval["prompt"].as_array().unwrap().len(), 16);
        assert_eq!(
            eval["sample"].as_str().unwrap().chars().count(),
            8,
            "{eval}"
        );
        let heads = eval["attention"][0].as_array().unwrap();
        assert_eq!(
            (eval["attention"].as_array().unwrap().len(), heads.len()),
            (1, 2)
        );
        for head in heads {
            let w: Vec<u64> = head
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert_eq!(w.len(), 16 * 16);
            for q in 0..16 {
                let row = &w[q * 16..(q + 1) * 16];
                assert!(row[q + 1..].iter().all(|&v| v == 0), "the future is masked");
                let sum: u64 = row[..=q].iter().sum();
                assert!(
                    sum.abs_diff(255) <= 1 + q as u64,
                    "row {q} sums to {sum}/255"
                );
            }
        }
    }
    let plot = std::fs::read_to_string(dir.join("run/loss.svg")).unwrap();
    assert!(plot.contains("best val") && plot.contains("learning rate"));
    fails(
        train(dir, "other", &["--set", "train.sample_prompt=\"§\""]),
        "`train.sample_prompt` cannot be written with this run's tokenizer",
    );
    assert!(
        !dir.join("other").exists(),
        "a refused run leaves no directory"
    );
}

/// `bench --json`: one line per config and backend with the step's, sampling's and a prompt's
/// figures; sampling is timed on a second pass of the same generation, with the first pass
/// beside it. A prompt as long as the context is refused.
#[test]
fn bench_reports_its_figures_as_json() {
    let tmp = tempfile::tempdir().unwrap();
    let out = ok(tinygpt(
        tmp.path(),
        &[
            "bench",
            "--config",
            "baby",
            "--backend",
            "fused",
            "--backend",
            "flex",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--sample-tokens",
            "30",
            "--prompt-tokens",
            "32",
            "--json",
        ],
    ));
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let backends: Vec<&str> = rows
        .iter()
        .map(|r| r["backend"].as_str().unwrap())
        .collect();
    assert_eq!(backends, ["fused", "flex"]);
    for row in &rows {
        assert_eq!(row["config"], "baby");
        assert_eq!(row["sample_tokens"], 30, "{row}");
        assert_eq!(row["prompt_tokens"], 32, "{row}");
        for key in [
            "ms_per_iter",
            "train_tokens_per_s",
            "sample_tokens_per_s",
            "first_sample_tokens_per_s",
            "prompt_tokens_per_s",
        ] {
            let value = row[key].as_f64().unwrap_or(f64::NAN);
            assert!(value.is_finite() && value > 0.0, "{key} = {value} in {row}");
        }
    }
    let long = [
        "bench",
        "--config",
        "baby",
        "--iters",
        "0",
        "--prompt-tokens",
        "64",
    ];
    fails(
        tinygpt(tmp.path(), &long),
        "--prompt-tokens 64 needs a context longer",
    );
}

/// `bench --streams N`: N generations stepped together through the batch decoder `serve`
/// uses, every stream's tokens counted; a CPU batch records no step (no `sample_graph`).
#[test]
fn bench_steps_streams_together() {
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "bench",
        "--config",
        "baby",
        "--iters",
        "0",
        "--sample-tokens",
        "20",
        "--streams",
        "3",
        "--json",
    ];
    let row: serde_json::Value =
        serde_json::from_str(ok(tinygpt(tmp.path(), &args)).trim()).unwrap();
    assert_eq!(row["sample_streams"], 3, "{row}");
    assert_eq!(row["sample_tokens"], 60, "{row}");
    assert!(row["sample_tokens_per_s"].as_f64().unwrap() > 0.0, "{row}");
    assert!(row.get("sample_graph").is_none(), "{row}");
}
