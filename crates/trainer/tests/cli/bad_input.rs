//! Bad input to every command: one clear line, a non-zero exit, nothing overwritten.

use super::*;

#[test]
fn bad_corpus_is_one_clear_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let run = |data: &str| {
        let mut args = vec!["train", "--data", data, "--out", "run", "--backend", "flex"];
        args.extend(TINY);
        tinygpt(dir, &args)
    };
    fails(run("missing.txt"), "cannot read corpus missing.txt");
    std::fs::write(dir.join("empty.txt"), "  \n").unwrap();
    fails(run("empty.txt"), "corpus empty.txt is empty");
    std::fs::write(dir.join("latin1.txt"), b"caf\xe9 au lait").unwrap();
    fails(
        run("latin1.txt"),
        "corpus latin1.txt is not UTF-8 text: invalid UTF-8 at byte 3",
    );
    std::fs::write(dir.join("short.txt"), "to be or not").unwrap();
    fails(run("short.txt"), "corpus too short");
    assert!(
        !dir.join("run").exists(),
        "a failed start must not create the run directory"
    );
}

#[test]
fn bad_config_names_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let with = |set: &str| train(dir, "run", &["--set", set]);
    fails(with("train.learning_ratee=1"), "learning_ratee");
    fails(with("model.n_head=3"), "n_head");
    fails(with("train.beta2=1.5"), "train.beta2");
    fails(with("data.tokenizer=words"), "tokenizer = \"words\"");
    std::fs::write(dir.join("bad.toml"), "[train]\nbatch_size = -4\n").unwrap();
    fails(
        tinygpt(
            dir,
            &[
                "train",
                "--config",
                "bad.toml",
                "--data",
                corpus().to_str().unwrap(),
            ],
        ),
        "batch_size = -4",
    );
    fails(
        tinygpt(dir, &["train", "--config", "nope.toml"]),
        "cannot read config nope.toml",
    );
    // An unknown backend is a usage error from the argument parser.
    let out = tinygpt(dir, &["train", "--backend", "tpu"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("invalid value 'tpu'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_checkpoints_and_prompts_are_errors_and_nothing_is_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(dir, "run", &["--max-iters", "5"]));
    let run = dir.join("run");
    let snapshot = |run: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        let mut files = Vec::new();
        for sub in ["", "best", "last"] {
            for entry in std::fs::read_dir(run.join(sub)).unwrap() {
                let path = entry.unwrap().path();
                if path.is_file() {
                    files.push((path.clone(), std::fs::read(&path).unwrap()));
                }
            }
        }
        files.sort();
        files
    };
    let before = snapshot(&run);

    // An existing run directory is refused without --resume.
    fails(
        train(dir, "run", &["--max-iters", "5"]),
        "already holds a run",
    );
    assert!(
        snapshot(&run) == before,
        "a refused run changed the checkpoint"
    );

    let sample = |ckpt: &str, prompt: &str| {
        tinygpt(
            dir,
            &[
                "generate",
                "--checkpoint",
                ckpt,
                "--prompt",
                prompt,
                "--max-new-tokens",
                "5",
                "--backend",
                "flex",
            ],
        )
    };
    fails(
        sample("run", "Zebra ✓"),
        "character '✓' (position 6) never occurs in the training corpus",
    );
    fails(sample("nowhere", "Of"), "checkpoint nowhere does not exist");

    // A corrupt weights file, in a copy of the run.
    let copy = |name: &str| {
        let to = dir.join(name);
        for (path, bytes) in &before {
            let rel = path.strip_prefix(&run).unwrap();
            std::fs::create_dir_all(to.join(rel).parent().unwrap()).unwrap();
            std::fs::write(to.join(rel), bytes).unwrap();
        }
        to
    };
    let corrupt = copy("corrupt");
    let weights = corrupt.join("best/model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    fails(
        sample("corrupt", "Of"),
        "best/model.safetensors is damaged: its checksum does not match",
    );

    // Weights of another architecture: the config says 64 wide, the weights are 32.
    let other = copy("other");
    let config = std::fs::read_to_string(other.join("config.toml")).unwrap();
    std::fs::write(
        other.join("config.toml"),
        config.replace("n_embd = 32", "n_embd = 64"),
    )
    .unwrap();
    fails(
        sample("other", "Of"),
        "do not fit this run's model: Shape mismatch",
    );

    // A truncated config or tokenizer.
    let broken = copy("broken");
    std::fs::write(broken.join("tokenizer.json"), "{\"kind\": \"char\"").unwrap();
    fails(sample("broken", "Of"), "tokenizer.json is invalid");
    fails(
        tinygpt(dir, &["eval", "--checkpoint", "broken"]),
        "tokenizer.json is invalid",
    );
    fails(
        tinygpt(dir, &["info", "--checkpoint", "nowhere"]),
        "does not exist",
    );

    assert!(
        snapshot(&run) == before,
        "failed commands changed the checkpoint"
    );
}

/// Started by a launcher as one of several ranks, a binary built without MPI refuses: each rank
/// would otherwise train a run of its own into the same directory.
#[cfg(not(feature = "mpi"))]
#[test]
fn several_ranks_without_mpi_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::command(
        dir.path(),
        &[
            "train",
            "--config",
            "baby",
            "--out",
            "run",
            "--max-iters",
            "1",
        ],
    )
    .env("OMPI_COMM_WORLD_SIZE", "2")
    .env("OMPI_COMM_WORLD_RANK", "0")
    .output()
    .unwrap();
    fails(
        out,
        "built without MPI: build it with `cargo build --release --features mpi`",
    );
    assert!(!dir.path().join("run").exists(), "nothing written");
}

/// Only `train` runs over ranks: any other command started so would do the same work N times.
#[test]
fn commands_other_than_train_refuse_several_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::command(dir.path(), &["params", "--config", "baby"])
        .env("PMI_SIZE", "2")
        .env("PMI_RANK", "1")
        .output()
        .unwrap();
    fails(
        out,
        "mpiexec (Hydra) started 2 ranks: only `tinygpt train` runs over several",
    );
}

/// `bench --all-reduce` times what ranks add up: started alone, it says how to start it.
#[test]
fn all_reduce_bench_alone_says_to_start_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::command(dir.path(), &["bench", "--all-reduce"])
        .output()
        .unwrap();
    fails(out, "start it under a launcher with two ranks or more");
}
