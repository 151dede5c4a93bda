//! LoRA fine-tuning through the binary: `train --init-from RUN --lora RANK` writes the adapters
//! alone, trains them on the fused engine and on Burn's (on an f32 base or one rounded to
//! `q8_0`), resumes bit for bit, samples and exports merged, and refuses in one line a base
//! that changed, an impossible rank or target, a changed architecture (a shorter context
//! crops the base's position table) and LoRA without a base; parts of the base
//! trained beside the adapters (`--also-train`) are checkpointed, resumed and sampled too.

use std::path::Path;

use super::common::*;

/// A LoRA run of rank 2 of `base` into `out` on `backend` to `steps`.
fn lora(dir: &Path, out: &str, backend: &str, steps: &str, extra: &[&str]) -> std::process::Output {
    lora_of_rank(dir, "2", out, backend, steps, extra)
}

fn lora_of_rank(
    dir: &Path,
    rank: &str,
    out: &str,
    backend: &str,
    steps: &str,
    extra: &[&str],
) -> std::process::Output {
    let mut args = vec![
        "--init-from",
        "base",
        "--lora",
        rank,
        "--max-iters",
        steps,
        "--set",
        "train.learning_rate=1e-2",
    ];
    args.extend(extra);
    train_on(dir, out, backend, &args)
}

#[test]
fn lora_trains_adapters_alone_resumes_exactly_and_samples_merged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(dir, "base", &["--max-iters", "10"]));
    let log = ok(lora(dir, "lora", "fused", "10", &[]));
    assert!(log.contains("done: step 10"), "{log}");
    // The checkpoint holds the adapters' factors alone: one A and one B per matrix.
    let tensors = weights(&dir.join("lora"));
    let names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), 2 * 4, "{names:?}");
    assert!(
        names
            .iter()
            .all(|n| n.ends_with(".lora.a") || n.ends_with(".lora.b")),
        "{names:?}"
    );
    let b = tensors
        .iter()
        .find(|(n, _)| n.ends_with(".lora.b"))
        .unwrap();
    assert!(b.1.iter().any(|&v| v != 0.0), "B learnt nothing");
    // Sampling reads the base with the adapters merged: other logits than the base's.
    let base = ok(tinygpt(
        dir,
        &["logits", "--checkpoint", "base", "--tokens", "1,2,3"],
    ));
    let tuned = ok(tinygpt(
        dir,
        &["logits", "--checkpoint", "lora", "--tokens", "1,2,3"],
    ));
    assert_ne!(base, tuned);
    ok(tinygpt(
        dir,
        &["generate", "--checkpoint", "lora", "--max-new-tokens", "5"],
    ));
    ok(tinygpt(dir, &["eval", "--checkpoint", "lora"]));
    // Stopped at 5 and resumed to 10: the same adapters, bit for bit.
    ok(lora(dir, "halves", "fused", "5", &[]));
    ok(tinygpt(
        dir,
        &["train", "--resume", "--out", "halves", "--max-iters", "10"],
    ));
    assert_eq!(weights(&dir.join("halves")), tensors);
    // Burn's autodiff trains the same adapters from the same start.
    let flex = ok(lora(dir, "flex", "flex", "10", &[]));
    assert!(flex.contains("done: step 10"), "{flex}");
    let first = |run: &str| metrics(&dir.join(run))[0].1;
    assert!((first("flex") - first("lora")).abs() < 1e-4);
    // Muon beside AdamW updates the factors too, and resumes exactly.
    let muon = ["--set", "train.optimizer=\"muon\""];
    ok(lora(dir, "muon", "fused", "10", &muon));
    ok(lora(dir, "muon-halves", "fused", "5", &muon));
    ok(tinygpt(
        dir,
        &[
            "train",
            "--resume",
            "--out",
            "muon-halves",
            "--max-iters",
            "10",
        ],
    ));
    assert_eq!(
        weights(&dir.join("muon-halves")),
        weights(&dir.join("muon"))
    );
    assert_ne!(weights(&dir.join("muon")), tensors);
    // Exports merge.
    ok(tinygpt(
        dir,
        &[
            "export",
            "--checkpoint",
            "lora",
            "--format",
            "hf",
            "--out",
            "hf",
        ],
    ));
    assert!(dir.join("hf/model.safetensors").exists());
}

#[test]
fn lora_refuses_a_changed_base_and_impossible_adapters() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(dir, "base", &["--max-iters", "5"]));
    // Without a base to adapt.
    fails(train(dir, "nobase", &["--lora", "2"]), "--init-from");
    assert!(!dir.join("nobase").exists());
    // A fine-tune keeps its base's architecture: a `--set model.KEY` that would change it is
    // refused by name, in full as with adapters, and so is a longer context; a shorter one
    // crops the learned position table to its first rows (nanoGPT's `crop_block_size`).
    let base = std::fs::read_to_string(dir.join("base/config.toml")).unwrap();
    let block: usize = base
        .lines()
        .find_map(|l| l.strip_prefix("block_size = "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the base's block_size");
    let longer = format!("model.block_size={}", block + 1);
    for lora in [&[][..], &["--lora", "2"]] {
        let args = [&["--init-from", "base", "--set", &longer][..], lora].concat();
        fails(train(dir, "longer", &args), "not longer");
        let args = [
            &["--init-from", "base", "--set", "model.n_layer=3"][..],
            lora,
        ]
        .concat();
        fails(train(dir, "deeper", &args), "model.n_layer is 1 there");
    }
    assert!(!dir.join("longer").exists() && !dir.join("deeper").exists());
    let shorter = format!("model.block_size={}", block / 2);
    // A step too small to move an f32 weight: the checkpoint holds the rows as read.
    let still = "train.learning_rate=1e-30";
    let args = [
        "--init-from",
        "base",
        "--max-iters",
        "1",
        "--set",
        &shorter,
        "--set",
        still,
        "--set",
        "train.min_lr=1e-30",
    ];
    ok(train(dir, "shorter", &args));
    let rows = |run: &str| {
        let bytes = std::fs::read(dir.join(run).join("best/model.safetensors")).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let wpe = file.tensor("wpe.weight").unwrap();
        (wpe.shape().to_vec(), wpe.data().to_vec())
    };
    let ((long, all), (short, first)) = (rows("base"), rows("shorter"));
    assert_eq!((long[0], short[0], short[1]), (block, block / 2, long[1]));
    assert_eq!(first, all[..first.len()], "the base's first rows");
    let args = [
        "--init-from",
        "base",
        "--max-iters",
        "1",
        "--lora",
        "2",
        "--set",
        &shorter,
    ];
    ok(train(dir, "shorter-lora", &args));
    // Its checkpoint reads the base as the run did: cropped.
    ok(tinygpt(
        dir,
        &["logits", "--checkpoint", "shorter-lora", "--tokens", "1"],
    ));
    // A rank above a matrix's side, a target the model lacks, a rank of 0.
    let wide = lora_of_rank(dir, "33", "wide", "fused", "2", &[]);
    fails(wide, "larger than");
    let targets = ["--set", "lora.targets=[\"qkv\", \"nope\"]"];
    fails(lora(dir, "nope", "fused", "2", &targets), "nope");
    let zero = lora_of_rank(dir, "0", "zero", "fused", "2", &[]);
    fails(zero, "at least 1");
    for out in ["wide", "nope", "zero"] {
        assert!(!dir.join(out).exists(), "{out} was written");
    }
    ok(lora(dir, "lora", "fused", "2", &[]));
    // A LoRA run is no base for another.
    let args = ["--init-from", "lora", "--lora", "2", "--max-iters", "1"];
    fails(train(dir, "again", &args), "LoRA run");
    // The base replaced by another run: refused in one line, nothing of the LoRA run lost.
    ok(train(dir, "other", &["--max-iters", "5", "--seed", "7"]));
    std::fs::rename(dir.join("base"), dir.join("old-base")).unwrap();
    std::fs::rename(dir.join("other"), dir.join("base")).unwrap();
    fails(
        tinygpt(dir, &["logits", "--checkpoint", "lora", "--tokens", "1"]),
        "has changed",
    );
    let resume = ["train", "--resume", "--out", "lora", "--max-iters", "4"];
    fails(tinygpt(dir, &resume), "has changed");
    assert!(dir.join("lora/last/model.safetensors").exists());
}

#[test]
fn lora_dropout_trains_on_every_engine_in_f32_and_is_refused_in_bf16() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(dir, "base", &["--max-iters", "5"]));
    let drop = ["--set", "lora.dropout=0.2"];
    ok(lora(dir, "drop", "fused", "6", &drop));
    let config = std::fs::read_to_string(dir.join("drop/config.toml")).unwrap();
    assert!(config.contains("dropout = 0.2"), "{config}");
    ok(lora(dir, "plain", "fused", "6", &[]));
    assert_ne!(weights(&dir.join("drop")), weights(&dir.join("plain")));
    // The masks come from the step's seed: stopped at 3 and resumed, the same adapters.
    ok(lora(dir, "halves", "fused", "3", &drop));
    let resume = ["train", "--resume", "--out", "halves", "--max-iters", "6"];
    ok(tinygpt(dir, &resume));
    assert_eq!(weights(&dir.join("halves")), weights(&dir.join("drop")));
    // Burn's autodiff drops the adapters' inputs too (its own masks): other adapters than
    // without; resumed, it follows the uninterrupted run closely (its masks after a resume
    // are not the same draws, as with Burn's model dropout: not bit for bit).
    ok(lora(dir, "flex", "flex", "6", &drop));
    ok(lora(dir, "flex-plain", "flex", "6", &[]));
    assert_ne!(weights(&dir.join("flex")), weights(&dir.join("flex-plain")));
    let (flex, plain) = (metrics(&dir.join("flex")), metrics(&dir.join("flex-plain")));
    assert_ne!(flex.last().unwrap().1, plain.last().unwrap().1);
    ok(lora(dir, "flex-halves", "flex", "3", &drop));
    let resume = [
        "train",
        "--resume",
        "--out",
        "flex-halves",
        "--max-iters",
        "6",
    ];
    ok(tinygpt(dir, &resume));
    let halves = metrics(&dir.join("flex-halves"));
    let (a, b) = (flex.last().unwrap(), halves.last().unwrap());
    assert_eq!(a.0, b.0);
    assert!((a.1 - b.1).abs() < 1e-3, "{flex:?} vs {halves:?}");
    // A mixed-precision step has no adapter inputs left to drop: refused, nothing written.
    let bf16 = ["--set", "lora.dropout=0.2", "--set", "train.dtype=\"bf16\""];
    fails(
        lora(dir, "bf16", "flex", "2", &bf16),
        "needs train.dtype = \"f32\"",
    );
    let high = ["--set", "lora.dropout=1.0"];
    fails(lora(dir, "high", "fused", "2", &high), "below 1");
    for out in ["bf16", "high"] {
        assert!(!dir.join(out).exists(), "{out} was written");
    }
}

#[test]
fn lora_on_an_int8_base_trains_on_every_engine_resumes_exactly_and_samples() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(dir, "base", &["--max-iters", "5"]));
    let int8 = ["--weights", "q8_0"];
    ok(lora(dir, "int8", "fused", "6", &int8));
    let config = std::fs::read_to_string(dir.join("int8/config.toml")).unwrap();
    assert!(config.contains("base = \"q8_0\""), "{config}");
    // The checkpoint holds the adapters alone, as any LoRA run's.
    let tensors = weights(&dir.join("int8"));
    assert_eq!(tensors.len(), 2 * 4);
    // The base's matrices rounded: another loss from the first step than in f32.
    ok(lora(dir, "plain", "fused", "6", &[]));
    let first = |run: &str| metrics(&dir.join(run))[0].1;
    assert_ne!(first("int8"), first("plain"));
    assert!((first("int8") - first("plain")).abs() < 0.05);
    // Stopped at 3 and resumed: the same adapters, bit for bit (the int8 copy is made again
    // from the base).
    ok(lora(dir, "halves", "fused", "3", &int8));
    let resume = ["train", "--resume", "--out", "halves", "--max-iters", "6"];
    ok(tinygpt(dir, &resume));
    assert_eq!(weights(&dir.join("halves")), tensors);
    // Burn's engines train on the same rounded values (in f32).
    ok(lora(dir, "flex", "flex", "6", &int8));
    assert!((first("flex") - first("int8")).abs() < 1e-4);
    // Sampled, evaluated and exported merged into the rounded base.
    let logits = |run: &str| {
        let args = ["logits", "--checkpoint", run, "--tokens", "1,2,3"];
        ok(tinygpt(dir, &args))
    };
    assert_ne!(logits("int8"), logits("plain"));
    ok(tinygpt(dir, &["eval", "--checkpoint", "int8"]));
    let generate = ["generate", "--checkpoint", "int8", "--max-new-tokens", "5"];
    ok(tinygpt(dir, &generate));
    // PEFT applies adapters to an f32 base: said when the adapters were trained on another.
    let peft = [
        "export",
        "--checkpoint",
        "int8",
        "--format",
        "peft",
        "--out",
        "peft",
    ];
    assert!(ok(tinygpt(dir, &peft)).contains("rounded to q8_0"));
    // Without adapters to train, or changed on resume: refused, nothing written.
    fails(train(dir, "alone", &int8), "--lora");
    assert!(!dir.join("alone").exists());
    let change = ["train", "--resume", "--out", "plain", "--weights", "q8_0"];
    fails(tinygpt(dir, &change), "cannot change `lora.base`");
}

/// `--weights q4_k`: the base rounded to four bits (this model's rows are not whole
/// super-blocks of 256: llama.cpp's fallback, Q5_0), held so by the fused engine; Burn's
/// engines train on the same values; resumed bit for bit; PEFT's export says so.
#[test]
fn lora_on_a_q4_k_base_trains_on_every_engine_resumes_exactly_and_samples() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(dir, "base", &["--max-iters", "5"]));
    let q4 = ["--weights", "q4_k"];
    ok(lora(dir, "q4", "fused", "6", &q4));
    let config = std::fs::read_to_string(dir.join("q4/config.toml")).unwrap();
    assert!(config.contains("base = \"q4_k\""), "{config}");
    let tensors = weights(&dir.join("q4"));
    assert_eq!(tensors.len(), 2 * 4);
    ok(lora(dir, "int8", "fused", "6", &["--weights", "q8_0"]));
    let first = |run: &str| metrics(&dir.join(run))[0].1;
    assert_ne!(first("q4"), first("int8"));
    assert!((first("q4") - first("int8")).abs() < 0.1);
    ok(lora(dir, "halves", "fused", "3", &q4));
    let resume = ["train", "--resume", "--out", "halves", "--max-iters", "6"];
    ok(tinygpt(dir, &resume));
    assert_eq!(weights(&dir.join("halves")), tensors);
    ok(lora(dir, "flex", "flex", "6", &q4));
    assert!((first("flex") - first("q4")).abs() < 1e-4);
    let generate = ["generate", "--checkpoint", "q4", "--max-new-tokens", "5"];
    ok(tinygpt(dir, &generate));
    let peft = [
        "export",
        "--checkpoint",
        "q4",
        "--format",
        "peft",
        "--out",
        "peft",
    ];
    assert!(ok(tinygpt(dir, &peft)).contains("rounded to q4_k"));
}

#[test]
fn parts_trained_beside_the_adapters_train_on_every_engine_resume_exactly_and_sample() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(dir, "base", &["--max-iters", "5"]));
    let parts = ["--also-train", "embedding,head"];
    let log = ok(lora(dir, "parts", "fused", "6", &parts));
    assert!(
        log.contains("\nlora: rank 2 (alpha 4) on qkv, attn_proj, fc, mlp_proj: "),
        "{log}"
    );
    assert!(
        log.contains("numbers trained, with embedding, head\n"),
        "{log}"
    );
    let config = std::fs::read_to_string(dir.join("parts/config.toml")).unwrap();
    assert!(
        config.contains("also_train = [\"embedding\", \"head\"]"),
        "{config}"
    );
    // The checkpoint holds the adapters and the parts (a tied head: the token embedding,
    // and the learned positions), trained away from the base's.
    let tensors = weights(&dir.join("parts"));
    let names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), 2 * 4 + 2, "{names:?}");
    let base = weights(&dir.join("base"));
    for part in ["wte.weight", "wpe.weight"] {
        let trained = tensors.iter().find(|(n, _)| n == part).expect(part);
        let was = base.iter().find(|(n, _)| n == part).unwrap();
        assert_ne!(trained.1, was.1, "{part} did not train");
    }
    // Stopped at 3 and resumed: the same adapters and parts, bit for bit.
    ok(lora(dir, "halves", "fused", "3", &parts));
    let resume = ["train", "--resume", "--out", "halves", "--max-iters", "6"];
    ok(tinygpt(dir, &resume));
    assert_eq!(weights(&dir.join("halves")), tensors);
    // Burn's autodiff trains the same parts: the same losses after the steps.
    ok(lora(dir, "flex", "flex", "6", &parts));
    let (fused, flex) = (metrics(&dir.join("parts")), metrics(&dir.join("flex")));
    assert_eq!(fused.len(), flex.len());
    for (a, b) in fused.iter().zip(&flex) {
        assert!((a.1 - b.1).abs() < 1e-3, "{fused:?} vs {flex:?}");
    }
    // Sampling reads them: other logits than the adapters alone give.
    ok(lora(dir, "plain", "fused", "6", &[]));
    let logits = |run: &str| {
        let args = ["logits", "--checkpoint", run, "--tokens", "1,2,3"];
        ok(tinygpt(dir, &args))
    };
    assert_ne!(logits("parts"), logits("plain"));
    ok(tinygpt(dir, &["eval", "--checkpoint", "parts"]));
    // Without adapters, an unknown part, or changed on resume: refused, nothing written.
    fails(train(dir, "alone", &parts), "--lora");
    let norms = ["--set", "lora.also_train=[\"norms\"]"];
    fails(lora(dir, "norms", "fused", "2", &norms), "norms");
    for out in ["alone", "norms"] {
        assert!(!dir.join(out).exists(), "{out} was written");
    }
    let change = [
        "train",
        "--resume",
        "--out",
        "plain",
        "--also-train",
        "head",
    ];
    fails(tinygpt(dir, &change), "cannot change `lora.also_train`");
}
