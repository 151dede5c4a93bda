//! `--weights file`: a run imported from a quantised GGUF file keeps its matrices' types
//! (`file-types.json`, shown by `info`) and decodes each range of rows in its file's type: a
//! q5_0 file as `--weights q5_0` does, to the logit; a file of mixed types (Q8_0 value
//! projections among Q4_0 matrices, as llama.cpp's mixes keep some matrices in more bits)
//! between its two types; a type kept in blocks, of a run that keeps none, in q8_0, said in one
//! line; a run not imported from a GGUF file refused in one line.

mod common;

use std::path::Path;

use common::*;
use tinygpt::interop::gguf::file::{Gguf, TensorType};
use tinygpt::interop::gguf::quant;

/// Llama's parts at width 64 (whole blocks of 32 for every matrix), trained 3 steps.
fn trained(dir: &Path) {
    let wide = [
        "--set",
        "model.n_embd=64",
        "--set",
        "model.mlp_hidden=128",
        "--max-iters",
        "3",
    ];
    ok(train_on(dir, "run", "fused", &[LLAMA, &wide].concat()));
}

fn eval_loss(line: &str) -> f64 {
    let part = line.split(" | ").find(|p| p.starts_with("loss ")).unwrap();
    part[5..].trim().parse().unwrap()
}

/// `command` (generate, or eval on `val.txt`) of `run` on the fused engine, with the weights
/// its default chooses.
fn plain<'a>(command: &str, run: &'a str) -> Vec<&'a str> {
    let args = match command {
        "generate" => vec![
            "generate",
            "--checkpoint",
            run,
            "--prompt",
            "the",
            "--temperature",
            "0",
            "--max-new-tokens",
            "24",
        ],
        _ => vec!["eval", "--checkpoint", run, "--data", "val.txt"],
    };
    [&args[..], &["--backend", "fused"]].concat()
}

fn run_with(dir: &Path, command: &str, run: &str, weights: &str) -> String {
    let args = plain(command, run);
    ok(tinygpt(dir, &[&args[..], &["--weights", weights]].concat()))
}

#[test]
fn a_quantised_file_decodes_each_matrix_in_its_own_type() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    std::fs::write(dir.join("val.txt"), words(7, 300).join(" ")).unwrap();
    let export = |dtype: &str, out: &str| {
        let args = [
            "export",
            "--checkpoint",
            "run",
            "--which",
            "last",
            "--format",
            "gguf",
        ];
        let dtype: Vec<&str> = dtype.split(' ').collect();
        ok(tinygpt(
            dir,
            &[&args[..], &["--dtype"], &dtype, &["--out", out]].concat(),
        ))
    };
    // Every matrix in Q5_0, the head too: the blocks `--weights q5_0` makes.
    export("q5_0 --pure", "q5.gguf");
    ok(tinygpt(
        dir,
        &["import", "--from", "q5.gguf", "--out", "q5"],
    ));
    let info = ok(tinygpt(dir, &["info", "--checkpoint", "q5"]));
    assert!(
        info.contains("imported from q5.gguf: matrices Q5_0 ×"),
        "{info}"
    );
    // Every matrix's blocks kept, as the file stores them.
    let count = info.split("Q5_0 ×").nth(1).unwrap();
    let count: String = count.chars().take_while(char::is_ascii_digit).collect();
    assert!(
        info.contains(&format!("kept blocks: {count} matrices")),
        "{info}"
    );
    // Loaded for `--weights file`, the run reads none of its matrices, nor its embedding (tied:
    // looked up in the head's blocks), and decodes as the whole model does.
    let unread = kept::loaded_without_kept_blocks_decodes_the_same(&dir.join("q5"), &[5, 1, 9, 2]);
    let matrices = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"];
    let blocks = unread.iter().filter(|p| p.starts_with("h.")).count();
    assert!(unread.contains(&"wte.weight".to_string()), "{unread:?}");
    assert!(blocks > 0 && blocks % matrices.len() == 0, "{unread:?}");
    for matrix in matrices {
        assert!(
            unread.contains(&format!("h.0.{matrix}.weight")),
            "{unread:?}"
        );
    }
    // The file's own blocks and ggml's quantiser's of the imported values are the same here.
    for command in ["generate", "eval"] {
        let (file, q5) = (
            run_with(dir, command, "q5", "file"),
            run_with(dir, command, "q5", "q5_0"),
        );
        match command {
            "generate" => assert_eq!(file, q5),
            _ => {
                assert!(file.contains("the GGUF file's matrices"), "{file}");
                assert_eq!(eval_loss(&file), eval_loss(&q5), "{file} vs {q5}");
            }
        }
    }

    // Without `--weights`, the imported run decodes its file's blocks on the CPU, and says so;
    // a run of tinygpt's own, f32.
    let plain = |run: &str, command: &str| {
        let out = tinygpt(dir, &plain(command, run));
        let said = stderr(&out).contains("(--weights file)");
        (ok(out), said)
    };
    let note = "the imported run decodes its blocks by default, and says so";
    assert_eq!(
        plain("q5", "generate"),
        (run_with(dir, "generate", "q5", "file"), true),
        "{note}"
    );
    let (scored, said) = plain("q5", "eval");
    assert!(
        said && scored.contains("the GGUF file's matrices"),
        "{scored}"
    );
    let own = (run_with(dir, "generate", "run", "f32"), false);
    assert_eq!(plain("run", "generate"), own);

    // Every value projection in Q8_0, every other matrix in Q4_0.
    export("f32", "f32.gguf");
    let mut file = Gguf::from_bytes(&std::fs::read(dir.join("f32.gguf")).unwrap()).unwrap();
    for t in &mut file.tensors {
        if t.ne.len() == 2 && t.ne[0] % 32 == 0 {
            let values = quant::decode(&t.data, t.kind).unwrap();
            t.kind = match t.name.contains("attn_v") {
                true => TensorType::Q8_0,
                false => TensorType::Q4_0,
            };
            t.data = quant::encode(&values, t.kind).unwrap();
        }
    }
    std::fs::write(dir.join("mixed.gguf"), file.to_bytes().unwrap()).unwrap();
    ok(tinygpt(
        dir,
        &["import", "--from", "mixed.gguf", "--out", "mixed"],
    ));
    let info = ok(tinygpt(dir, &["info", "--checkpoint", "mixed"]));
    assert!(
        info.contains("matrices Q4_0 ×") && info.contains("Q8_0 ×1"),
        "{info}"
    );
    let loss = |weights: &str| eval_loss(&run_with(dir, "eval", "mixed", weights));
    let (mixed, four, eight, f32s) = (loss("file"), loss("q4_0"), loss("q8_0"), loss("f32"));
    assert!(mixed != four && mixed != eight, "{mixed} {four} {eight}");
    assert!((mixed - f32s).abs() < 0.05 * f32s, "{mixed} vs f32 {f32s}");
    assert!(!run_with(dir, "generate", "mixed", "file").is_empty());

    // A type kept in blocks, of a run that keeps none (imported before they were kept):
    // q8_0 of its values, said in one line that says how to keep them; a type that is none is
    // refused.
    let types = dir.join("mixed/file-types.json");
    let mut old: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&types).unwrap()).unwrap();
    forget_kept(&mut old);
    let text = serde_json::to_string_pretty(&old).unwrap();
    std::fs::remove_file(dir.join("mixed/file-blocks.bin")).unwrap();
    let args = ["generate", "--checkpoint", "mixed", "--backend", "fused"];
    for kind in ["Q6_K", "Q5_1"] {
        std::fs::write(&types, text.replacen("\"Q8_0\"", &format!("\"{kind}\""), 1)).unwrap();
        let out = tinygpt(
            dir,
            &[&args[..], &["--weights", "file", "--max-new-tokens", "4"]].concat(),
        );
        ok(out.clone());
        let said = stderr(&out);
        let want = format!("{kind} matrices decode as q8_0 (the run keeps no blocks");
        assert!(said.contains(&want), "{said}");
    }
    std::fs::write(&types, text.replacen("\"Q8_0\"", "\"Q9_9\"", 1)).unwrap();
    fails(
        tinygpt(dir, &[&args[..], &["--weights", "file"]].concat()),
        "Q9_9 is not a ggml type tinygpt reads",
    );
    fails(
        tinygpt(
            dir,
            &[
                "generate",
                "--checkpoint",
                "run",
                "--backend",
                "fused",
                "--weights",
                "file",
            ],
        ),
        "was not imported from one",
    );
}

/// A run's types as a run imported before the blocks were kept wrote them: no `kept`.
fn forget_kept(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.remove("kept");
            map.values_mut().for_each(forget_kept);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(forget_kept),
        _ => {}
    }
}
