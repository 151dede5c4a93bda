//! Bad inputs, interruptions and damaged token files: one line, nothing half-written, every damage
//! found and named.

use super::*;

#[test]
fn bad_inputs_are_one_line_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("mixed")).unwrap();
    std::fs::write(dir.join("mixed/good.txt"), "good text\n".repeat(100)).unwrap();
    std::fs::write(dir.join("mixed/latin1.txt"), b"caf\xe9 au lait\n").unwrap();
    std::fs::write(dir.join("mixed/zeros.txt"), [b'a', 0, 0, 0]).unwrap();
    std::fs::create_dir_all(dir.join("empty")).unwrap();
    let before: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();

    fails(
        prepare(dir, &["--data", "mixed", "--out", "p"]),
        "corpus mixed/latin1.txt is not UTF-8 text: invalid UTF-8 at byte 3",
    );
    fails(
        prepare(dir, &["--data", "empty", "--out", "p"]),
        "folder empty has no files matching *.txt,*.text,*.md,*.rst",
    );
    fails(
        prepare(dir, &["--data", "nowhere.txt", "--out", "p"]),
        "cannot read corpus nowhere.txt",
    );
    fails(
        prepare(dir, &["--data", "mixed", "chats.jsonl", "--out", "p"]),
        "mixed is not a .jsonl file: conversations and text are prepared separately",
    );
    let after: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(before, after, "a failed prepare left something behind");

    let log = ok(prepare(
        dir,
        &["--data", "mixed", "--out", "p", "--skip-invalid"],
    ));
    assert!(
        log.contains("skipped mixed/latin1.txt: invalid UTF-8 at byte 3"),
        "{log}"
    );
    assert!(
        log.contains("skipped mixed/zeros.txt: a NUL byte at byte 1"),
        "{log}"
    );
    assert_eq!(meta(&dir.join("p"))["inputs"].as_array().unwrap().len(), 1);

    // A damaged prepared directory is refused by name.
    let train = |data: &str| {
        tinygpt(
            dir,
            &[
                &["train", "--data", data, "--out", "run", "--backend", "flex"][..],
                &TINY[..],
            ]
            .concat(),
        )
    };
    std::fs::create_dir_all(dir.join("cut")).unwrap();
    for f in ["meta.json", "tokenizer.json", "train.bin", "val.bin"] {
        std::fs::copy(dir.join("p").join(f), dir.join("cut").join(f)).unwrap();
    }
    let bin = dir.join("cut/train.bin");
    let len = std::fs::metadata(&bin).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&bin)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    fails(train("cut"), "cut/train.bin is truncated or damaged");
    std::fs::write(
        dir.join("cut/tokenizer.json"),
        r#"{"kind": "char", "itos": ["a", "b"]}"#,
    )
    .unwrap();
    fails(train("cut"), "the token files are for a vocabulary of");
    assert!(!dir.join("run").exists());
}

/// The hidden staging directories `prepare` writes into beside `--out p`.
fn staging(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".p.prepare-"))
        .collect()
}

/// A prepare that waits on its standard input: it has made its staging directory.
fn waiting_prepare(dir: &Path) -> std::process::Child {
    let child = Command::new(env!("CARGO_BIN_EXE_tinygpt"))
        .args(["prepare", "--data", "-", "--out", "p"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while staging(dir).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(30), "no staging dir");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Stopped by SIGTERM (or Ctrl-C), prepare removes what it wrote and exits 130; killed with
/// -9, it cannot, and the next prepare into the same place removes what it left.
#[cfg(unix)]
#[test]
fn an_interrupted_prepare_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let child = waiting_prepare(dir);
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(stderr(&out).contains("interrupted; nothing was written"));
    assert_eq!(staging(dir), Vec::<String>::new());
    assert!(!dir.join("p").exists());

    let mut child = waiting_prepare(dir);
    child.kill().unwrap();
    child.wait().unwrap();
    let left = staging(dir);
    assert_eq!(
        left.len(),
        1,
        "a killed prepare leaves its staging dir: {left:?}"
    );
    let out = prepare(
        dir,
        &["--data", &corpus().display().to_string(), "--out", "p"],
    );
    let said = stderr(&out);
    ok(out);
    assert!(
        said.contains(&format!("note: removed ./{}", left[0])),
        "{said}"
    );
    assert_eq!(staging(dir), Vec::<String>::new());
    assert!(dir.join("p/meta.json").is_file());
}

/// A file held out with --val-files that is also given to --data is refused.
#[test]
fn held_out_files_cannot_also_be_training_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir(dir.join("books")).unwrap();
    std::fs::write(dir.join("books/a.txt"), "the first book\n".repeat(50)).unwrap();
    std::fs::write(dir.join("books/b.txt"), "the second book\n".repeat(50)).unwrap();
    fails(
        prepare(
            dir,
            &[
                "--data",
                "books",
                "--val-files",
                "./books/b.txt",
                "--out",
                "p",
            ],
        ),
        "--val-files ./books/b.txt is also in --data (as books/b.txt)",
    );
    assert!(!dir.join("p").exists());
    ok(prepare(
        dir,
        &[
            "--data",
            "books/a.txt",
            "--val-files",
            "books/b.txt",
            "--out",
            "p",
        ],
    ));
}

/// Token files damaged after prepare (same-size noise inside the vocabulary, one id out of
/// range, cut offsets) are one-line errors naming the file: from `prepare --verify`, and from
/// `train` before it writes a checkpoint. A directory from before checksums still opens.
#[test]
fn damaged_token_files_are_found_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let corpus = corpus().display().to_string();
    ok(prepare(dir, &["--data", &corpus, "--out", "p"]));
    let verify = |name: &str| prepare(dir, &["--verify", name]);
    assert!(ok(verify("p")).contains("SHA-256, sizes and token ids match meta.json"));
    let copy = |name: &str| {
        std::fs::create_dir(dir.join(name)).unwrap();
        for f in std::fs::read_dir(dir.join("p")).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), dir.join(name).join(f.file_name())).unwrap();
        }
    };
    let vocab = meta(&dir.join("p"))["vocab_size"].as_u64().unwrap() as u16;
    let mut ids = std::fs::read(dir.join("p/train.bin")).unwrap();

    copy("noise");
    let mut state = 1u32;
    for pair in ids.chunks_exact_mut(2) {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        pair.copy_from_slice(&((state >> 16) as u16 % vocab).to_le_bytes());
    }
    std::fs::write(dir.join("noise/train.bin"), &ids).unwrap();
    fails(
        verify("noise"),
        "noise/train.bin: its SHA-256 is not the one meta.json recorded",
    );
    let out = tinygpt(
        dir,
        &[
            &[
                "train",
                "--data",
                "noise",
                "--out",
                "run",
                "--backend",
                "fused",
            ][..],
            &TINY[..],
            &["--max-iters", "30"],
        ]
        .concat(),
    );
    assert!(!out.status.success());
    let said = stderr(&out);
    assert!(
        said.trim_end()
            .lines()
            .last()
            .unwrap()
            .contains("noise/train.bin: its SHA-256"),
        "{said}"
    );
    assert!(!dir.join("run/last").exists(), "a checkpoint was written");

    copy("outside");
    let mut ids = std::fs::read(dir.join("p/val.bin")).unwrap();
    ids[200..202].copy_from_slice(&vocab.to_le_bytes());
    std::fs::write(dir.join("outside/val.bin"), &ids).unwrap();
    fails(
        verify("outside"),
        &format!("outside/val.bin: token 100 is id {vocab}, outside the vocabulary of {vocab}"),
    );

    ok(prepare(
        dir,
        &["--data", &corpus, "--separator", "\\n\\n", "--out", "docs"],
    ));
    let offsets = dir.join("docs/train.docs.bin");
    let len = std::fs::metadata(&offsets).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&offsets)
        .unwrap()
        .set_len(len - 8)
        .unwrap();
    fails(
        verify("docs"),
        "docs/train.docs.bin is truncated or damaged",
    );

    copy("old");
    let mut old = meta(&dir.join("old"));
    old.as_object_mut().unwrap().remove("sha256");
    std::fs::write(dir.join("old/meta.json"), old.to_string()).unwrap();
    assert!(ok(verify("old")).contains("no checksums to compare"));
}

#[test]
fn an_interrupted_prepare_leaves_no_output() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let text = std::fs::read_to_string(corpus()).unwrap();
    let mut big = std::fs::File::create(dir.join("big.txt")).unwrap();
    for _ in 0..60 {
        big.write_all(text.as_bytes()).unwrap();
    }
    drop(big);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tinygpt"))
        .args([
            "prepare",
            "--data",
            "big.txt",
            "--out",
            "p",
            "--tokenizer",
            "bpe",
        ])
        .current_dir(dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once it is writing (its staging directory made), not after a guessed time.
    while staging(dir).is_empty() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "prepare ended before it made its staging directory"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "prepare ended before it was killed"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!dir.join("p").exists(), "a killed prepare left its output");
    ok(prepare(dir, &["--data", "big.txt", "--out", "p"]));
    assert!(dir.join("p/meta.json").is_file());
}
