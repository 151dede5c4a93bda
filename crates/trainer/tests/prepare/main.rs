//! `tinygpt prepare` and training on prepared directories, through the real binary.

mod bad_input;
#[path = "../common/mod.rs"]
mod common;
mod conversations;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn prepare(dir: &Path, args: &[&str]) -> std::process::Output {
    tinygpt(dir, &[&["prepare"][..], args].concat())
}

fn meta(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap()
}

/// `prepare` then `train --data DIR` gives the losses of `train --data FILE`, for both
/// tokenizers (the file is prepared into the run directory by the same code).
#[test]
fn training_on_a_prepared_directory_equals_training_on_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let corpus = corpus();
    let corpus = corpus.to_str().unwrap();
    for tokenizer in ["char", "bpe"] {
        let prepared = format!("prepared-{tokenizer}");
        let log = ok(prepare(
            dir,
            &[
                "--data",
                corpus,
                "--out",
                &prepared,
                "--tokenizer",
                tokenizer,
                "--bpe-vocab-size",
                "300",
            ],
        ));
        assert!(log.starts_with(&format!("prepared {prepared}: ")), "{log}");
        let settings = [
            "--max-iters",
            "10",
            "--set",
            &format!("data.tokenizer={tokenizer}"),
            "--set",
            "data.bpe_vocab_size=300",
        ];
        let from_dir = tinygpt(
            dir,
            &[
                &[
                    "train",
                    "--data",
                    &prepared,
                    "--out",
                    "a",
                    "--backend",
                    "flex",
                ][..],
                &TINY[..],
                &settings[..],
            ]
            .concat(),
        );
        ok(from_dir);
        ok(train(dir, "b", &settings));
        let losses = |run: &str| metrics(&dir.join(run));
        assert_eq!(losses("a"), losses("b"), "{tokenizer}");
        assert_eq!(
            std::fs::read(dir.join("a/tokenizer.json")).unwrap(),
            std::fs::read(dir.join("b/tokenizer.json")).unwrap()
        );
        // The file was prepared into the run; the same tokens as `prepare` wrote.
        for file in ["train.bin", "val.bin"] {
            assert!(
                std::fs::read(dir.join(&prepared).join(file)).unwrap()
                    == std::fs::read(dir.join("b/data").join(file)).unwrap(),
                "{tokenizer} {file}"
            );
        }
        // Resuming maps those tokens again, and eval reads the run's validation split.
        ok(tinygpt(
            dir,
            &["train", "--resume", "--out", "b", "--max-iters", "12"],
        ));
        let eval = ok(tinygpt(
            dir,
            &["eval", "--checkpoint", "b", "--which", "last"],
        ));
        assert!(eval.contains("validation split"), "{eval}");
        std::fs::remove_dir_all(dir.join("a")).unwrap();
        std::fs::remove_dir_all(dir.join("b")).unwrap();
    }
}

/// The token file `path` as ids (u16) or offsets (u64).
fn read_le<const N: usize>(path: &Path) -> Vec<u64> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(N)
        .map(|b| b.iter().rev().fold(0u64, |n, &byte| n << 8 | byte as u64))
        .collect()
}

/// `prepare --separator` encodes each document on its own, chunk by chunk, exactly as the text
/// split in memory; `documents` batching then trains on the prepared directory as on the file.
#[test]
fn documents_prepared_with_a_separator_train_as_from_the_text() {
    use tinygpt::data::documents::Documents;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Stanzas of 1 to 6 lines, some separated by more than one blank line; over 2 MB, so
    // prepare reads it in several chunks.
    let text = std::fs::read_to_string(corpus()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut stanzas = String::new();
    let mut at = 0;
    while stanzas.len() < 2_500_000 {
        let n = 1 + at % 6;
        let stanza: Vec<&str> = (at..at + n).map(|i| lines[i % lines.len()]).collect();
        stanzas.push_str(&stanza.join("\n"));
        stanzas.push_str(if at % 7 == 0 { "\n\n\n\n" } else { "\n\n" });
        at += n;
    }
    std::fs::write(dir.join("stanzas.txt"), &stanzas).unwrap();
    let log = ok(prepare(
        dir,
        &[
            "--data",
            "stanzas.txt",
            "--out",
            "docs",
            "--separator",
            "\\n\\n",
        ],
    ));
    let m = meta(&dir.join("docs"));
    assert_eq!(m["separator"], "\n\n");

    // The same documents and tokens as splitting the whole text in memory.
    let tokenizer = tinygpt::data::tokenizer::Tokenizer::from_json(
        &std::fs::read_to_string(dir.join("docs/tokenizer.json")).unwrap(),
    )
    .unwrap();
    let whole = Documents::of_text(&stanzas, &tokenizer, "\n\n", 16).unwrap();
    let train = read_le::<8>(&dir.join("docs/train.docs.bin"));
    let val = read_le::<8>(&dir.join("docs/val.docs.bin"));
    let split = *train.last().unwrap();
    let rejoined: Vec<u64> = train
        .iter()
        .copied()
        .chain(val[1..].iter().map(|o| o + split))
        .collect();
    assert_eq!(rejoined, whole.offsets());
    let tokens: Vec<u64> = [
        read_le::<2>(&dir.join("docs/train.bin")),
        read_le::<2>(&dir.join("docs/val.bin")),
    ]
    .concat();
    assert_eq!(tokens.len(), whole.tokens());
    assert_eq!(m["train_documents"], train.len() as u64 - 1);
    assert_eq!(m["val_documents"], val.len() as u64 - 1);
    assert!(
        log.contains(&format!(
            "{} train + {} val documents",
            train.len() - 1,
            val.len() - 1
        )),
        "{log}"
    );
    // Validation starts at the document boundary nearest 90% of the tokens.
    let ninety = whole.tokens() as f64 * 0.9;
    assert!((split as f64 - ninety).abs() < 200.0, "{split} vs {ninety}");

    // Training with `documents` batching: the prepared directory, then the text itself.
    let settings = ["--max-iters", "10", "--set", "data.batching=documents"];
    let from_dir = [
        &["train", "--data", "docs", "--out", "a", "--backend", "flex"][..],
        &TINY[..],
        &settings[..],
    ]
    .concat();
    ok(tinygpt(dir, &from_dir));
    let from_text = [
        &[
            "train",
            "--data",
            "stanzas.txt",
            "--out",
            "b",
            "--backend",
            "flex",
        ][..],
        &TINY[..],
        &settings[..],
    ]
    .concat();
    ok(tinygpt(dir, &from_text));
    assert_eq!(metrics(&dir.join("a")), metrics(&dir.join("b")));
    assert_eq!(
        std::fs::read(dir.join("b/data/val.docs.bin")).unwrap(),
        std::fs::read(dir.join("docs/val.docs.bin")).unwrap()
    );

    // A directory prepared without the separator cannot batch documents; a damaged offsets
    // file is named.
    ok(prepare(dir, &["--data", "stanzas.txt", "--out", "plain"]));
    let mut plain = from_dir.clone();
    plain[2] = "plain";
    plain[4] = "c";
    fails(tinygpt(dir, &plain), "prepare it again with --separator");
    let docs = dir.join("docs/val.docs.bin");
    let bytes = std::fs::read(&docs).unwrap();
    std::fs::write(&docs, &bytes[..bytes.len() - 8]).unwrap();
    plain[2] = "docs";
    fails(tinygpt(dir, &plain), "val.docs.bin is truncated or damaged");
    // A usage error, as clap reports them (exit 2).
    let empty = prepare(
        dir,
        &["--data", "stanzas.txt", "--out", "e", "--separator", ""],
    );
    assert_eq!(empty.status.code(), Some(2));
    assert!(stderr(&empty).contains("the separator must not be empty"));
}

#[test]
fn folders_stdin_held_out_files_and_wide_vocabularies() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let books = dir.join("books");
    std::fs::create_dir_all(books.join("volume-2")).unwrap();
    std::fs::write(books.join("a.txt"), "first book\n".repeat(200)).unwrap();
    std::fs::write(books.join("volume-2/b.md"), "second book\n".repeat(200)).unwrap();
    std::fs::write(books.join("notes.pdf"), [0u8, 1, 2, 3]).unwrap();
    std::fs::write(books.join(".hidden.txt"), "not read").unwrap();
    let held_out = dir.join("held-out.txt");
    std::fs::write(&held_out, "third book\n".repeat(50)).unwrap();
    ok(prepare(
        dir,
        &[
            "--data",
            "books",
            "--val-files",
            "held-out.txt",
            "--out",
            "p",
        ],
    ));
    let m = meta(&dir.join("p"));
    let inputs: Vec<&str> = m["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        inputs,
        ["books/a.txt", "books/volume-2/b.md", "held-out.txt"]
    );
    assert_eq!(m["train_tokens"], 11 * 200 + 12 * 200);
    assert_eq!(m["val_tokens"], 11 * 50);
    assert_eq!(m["width"], "u16");
    assert_eq!(
        std::fs::metadata(dir.join("p/train.bin")).unwrap().len(),
        2 * (11 * 200 + 12 * 200)
    );

    // Standard input, as a pipe.
    let mut child = Command::new(env!("CARGO_BIN_EXE_tinygpt"))
        .args(["prepare", "--data", "-", "--out", "from-stdin"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all("piped text\n".repeat(100).as_bytes())
        .unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    let m = meta(&dir.join("from-stdin"));
    assert_eq!(m["inputs"][0]["path"], "-");
    assert_eq!(
        m["train_tokens"].as_u64().unwrap() + m["val_tokens"].as_u64().unwrap(),
        1100
    );
    assert!(!dir.join("from-stdin/.input-0.txt").exists());

    // A named pipe (as `--data <(command)` gives): read once, copied in like standard input.
    #[cfg(unix)]
    {
        let fifo = dir.join("fifo");
        let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let writer = std::thread::spawn(move || {
            std::fs::write(&fifo, "through a pipe\n".repeat(100)).unwrap();
        });
        ok(prepare(dir, &["--data", "fifo", "--out", "from-fifo"]));
        writer.join().unwrap();
        let m = meta(&dir.join("from-fifo"));
        assert_eq!(m["inputs"][0]["path"], "fifo");
        assert_eq!(m["inputs"][0]["bytes"], 1500);
        assert_eq!(
            m["train_tokens"].as_u64().unwrap() + m["val_tokens"].as_u64().unwrap(),
            1500
        );
        let hidden: Vec<_> = std::fs::read_dir(dir.join("from-fifo"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .collect();
        assert!(hidden.is_empty(), "{hidden:?}");
    }

    // More than 65,536 distinct characters: u32 ids.
    let wide: String = (0x4E00u32..0x4E00 + 70_000)
        .filter_map(char::from_u32)
        .collect();
    std::fs::write(dir.join("wide.txt"), wide.repeat(2)).unwrap();
    ok(prepare(dir, &["--data", "wide.txt", "--out", "wide"]));
    let m = meta(&dir.join("wide"));
    assert_eq!(m["width"], "u32");
    assert!(m["vocab_size"].as_u64().unwrap() > 65_536);
    let tokens = m["train_tokens"].as_u64().unwrap() + m["val_tokens"].as_u64().unwrap();
    let bytes = std::fs::metadata(dir.join("wide/train.bin")).unwrap().len()
        + std::fs::metadata(dir.join("wide/val.bin")).unwrap().len();
    assert_eq!(bytes, 4 * tokens);
}
