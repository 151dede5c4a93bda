//! `tinygpt prepare` on `.jsonl` conversations: the prepared directory trains exactly as the
//! file does, and damage or bad lines are named.

use std::path::Path;

use super::common::*;
use super::prepare;

/// Conversations of several shapes: system prompts, two replies, prompt/completion pairs,
/// blank lines, and one too long for a block of 64 (cut) whose reply starts past it (left out).
fn write_conversations(dir: &Path) {
    let words = words(3, 120);
    let mut lines = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let line = match i % 3 {
            0 => serde_json::json!({"messages": [
                {"role": "system", "content": "loud"},
                {"role": "user", "content": format!("shout {w}")},
                {"role": "assistant", "content": w.to_uppercase()}]}),
            1 => serde_json::json!({"messages": [
                {"role": "user", "content": w},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "again"},
                {"role": "assistant", "content": w}]}),
            _ => {
                serde_json::json!({"prompt": w, "completion": w.chars().rev().collect::<String>()})
            }
        };
        lines.push(line.to_string());
        if i % 10 == 0 {
            lines.push(String::new());
        }
    }
    let long =
        serde_json::json!({"prompt": super::common::words(9, 40).concat(), "completion": "y"});
    lines.insert(7, long.to_string());
    std::fs::write(dir.join("talk.jsonl"), lines.join("\n")).unwrap();
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// A learnt tokenizer (char and BPE), and a run's tokenizer and chat template with
/// `--init-from`: training on the prepared directory gives the losses and weights of training
/// on the file, which is rendered in memory by the same code.
#[test]
fn prepared_conversations_train_as_the_file_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_conversations(dir);
    let fused = ["--backend", "fused", "--max-iters", "6"];
    let block = ["--set", "model.block_size=64"];
    for tokenizer in ["char", "bpe"] {
        let prepared = format!("talk-{tokenizer}");
        let log = ok(prepare(
            dir,
            &[
                "--data",
                "talk.jsonl",
                "--out",
                &prepared,
                "--tokenizer",
                tokenizer,
                "--bpe-vocab-size",
                "270",
            ],
        ));
        assert!(log.contains("109 train + 12 val conversations"), "{log}");
        let settings = [
            "--set",
            &format!("data.tokenizer={tokenizer}"),
            "--set",
            "data.bpe_vocab_size=270",
            "--set",
            "model.block_size=64",
        ];
        let (a, b) = (format!("{tokenizer}-a"), format!("{tokenizer}-b"));
        for (out, data) in [(&a, prepared.as_str()), (&b, "talk.jsonl")] {
            let args = [
                &["train", "--data", data, "--out", out][..],
                &TINY,
                &fused,
                &settings,
            ];
            let log = ok(tinygpt(dir, &args.concat()));
            assert!(
                log.contains("conversations: 108 train / 12 val conversations")
                    && log.contains("1 cut to block_size + 1 tokens, 1 left out"),
                "{log}"
            );
        }
        let (a, b) = (dir.join(a), dir.join(b));
        assert_eq!(metrics(&a), metrics(&b), "{tokenizer}");
        assert_eq!(weights(&a), weights(&b), "{tokenizer}");
        assert_eq!(
            read(&a.join("tokenizer.json")),
            read(&b.join("tokenizer.json"))
        );
        let config = std::fs::read_to_string(a.join("config.toml")).unwrap();
        assert!(
            config.contains("<|assistant|>"),
            "tinygpt's own chat format: {config}"
        );
    }

    // Fine-tuning `char-a` on conversations prepared in its tokenizer and template; resumed, and
    // evaluated on the prepared validation split.
    ok(prepare(
        dir,
        &[
            "--data",
            "talk.jsonl",
            "--tokenizer-from",
            "char-a",
            "--out",
            "for-a",
        ],
    ));
    for (out, data) in [("tuned-p", "for-a"), ("tuned-f", "talk.jsonl")] {
        let args = [
            &[
                "train",
                "--init-from",
                "char-a",
                "--data",
                data,
                "--out",
                out,
            ][..],
            &fused,
            &block,
        ];
        ok(tinygpt(dir, &args.concat()));
    }
    assert_eq!(weights(&dir.join("tuned-p")), weights(&dir.join("tuned-f")));
    let resume = ["train", "--resume", "--out", "tuned-p", "--max-iters", "8"];
    ok(tinygpt(dir, &resume));
    let eval = ok(tinygpt(dir, &["eval", "--checkpoint", "tuned-p"]));
    assert!(eval.contains("validation split of for-a"), "{eval}");
    let verify = ok(prepare(dir, &["--verify", "for-a"]));
    assert!(verify.contains("match meta.json"), "{verify}");
}

/// A bad line, text among the conversations, a template that differs from the run's, and
/// damaged taught marks: one line each, nothing written.
#[test]
fn bad_conversations_and_damaged_marks_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_conversations(dir);
    let mut text = std::fs::read_to_string(dir.join("talk.jsonl")).unwrap();
    text.push_str("\n{\"prompt\": \"no reply\"}\n");
    std::fs::write(dir.join("bad.jsonl"), &text).unwrap();
    let lines = text.lines().count();
    fails(
        prepare(dir, &["--data", "bad.jsonl", "--out", "p"]),
        &format!("bad.jsonl: line {lines}: not a conversation"),
    );
    std::fs::write(dir.join("notes.txt"), "text").unwrap();
    fails(
        prepare(dir, &["--data", "talk.jsonl", "notes.txt", "--out", "p"]),
        "notes.txt is not a .jsonl file: conversations and text are prepared separately",
    );
    assert!(!dir.join("p").exists());

    ok(prepare(dir, &["--data", "talk.jsonl", "--out", "p"]));
    fails(
        tinygpt(
            dir,
            &[
                &["train", "--data", "p", "--set", "chat.stop=[\"x\"]"][..],
                &TINY,
            ]
            .concat(),
        ),
        "p holds conversations written with another chat template than this run's [chat]",
    );
    let marks = dir.join("p/train.taught.bin");
    let mut bytes = read(&marks);
    bytes[5] = 2;
    std::fs::write(&marks, &bytes).unwrap();
    fails(
        prepare(dir, &["--verify", "p"]),
        "train.taught.bin: token 5's taught mark is 2, not 0 or 1",
    );
    std::fs::write(&marks, &bytes[..9]).unwrap();
    fails(
        tinygpt(dir, &[&["train", "--data", "p"][..], &TINY].concat()),
        "train.taught.bin is truncated or damaged: 9 bytes",
    );
}
