//! Training over MPI ranks (the `mpi` feature; docs/distributed.md): `mpirun -np 2 tinygpt
//! train` is the one-process run, split. Built only with the feature, which needs an MPI; run
//! by README's second test command, under Open MPI's `mpirun`.
#![cfg(feature = "mpi")]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::watched::Watched;
use common::{TINY, stderr, stdout};

/// `mpirun -np ranks tinygpt args` in `dir`, not started yet.
fn mpirun_command(dir: &Path, ranks: usize, args: &[String]) -> Command {
    let mut command = Command::new("mpirun");
    command
        .args(["--oversubscribe", "--bind-to", "none", "-np"])
        .arg(ranks.to_string())
        .arg(env!("CARGO_BIN_EXE_tinygpt"))
        .args(args)
        .current_dir(dir)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        // Containers run as root and lack cross-memory attach.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
    command
}

/// `mpirun -np ranks tinygpt args` in `dir`, run to its end.
fn mpirun(dir: &Path, ranks: usize, args: &[String]) -> Output {
    let mut command = mpirun_command(dir, ranks, args);
    command.output().expect("mpirun runs (install openmpi-bin)")
}

/// One process's `tinygpt args` in `dir`.
fn alone(dir: &Path, args: &[String]) -> Output {
    common::command(dir, args)
        .output()
        .expect("the binary runs")
}

/// A run of `config` to `steps` (dropout on, the schedule's length fixed whatever `steps`),
/// one thread a process, `grad_accum` micro-batches, into `out`.
fn args(config: &str, out: &str, grad_accum: usize, steps: usize) -> Vec<String> {
    let corpus = common::corpus().display().to_string();
    let mut args: Vec<String> = [
        "train",
        "--config",
        config,
        "--data",
        &corpus,
        "--out",
        out,
        "--backend",
        "fused",
    ]
    .map(String::from)
    .to_vec();
    args.extend(["--max-iters".into(), steps.to_string()]);
    for set in [
        "train.threads=1".to_string(),
        "model.dropout=0.1".into(),
        "train.log_interval=1".into(),
        "train.lr_decay_iters=400".into(),
        format!("train.grad_accum={grad_accum}"),
    ] {
        args.extend(["--set".into(), set]);
    }
    args.extend(TINY.map(String::from));
    args
}

/// `train --resume` of the run `out` to step `end` on the fused engine.
fn resume_to(out: &str, end: usize) -> Vec<String> {
    let line = format!("train --resume --out {out} --max-iters {end} --backend fused");
    line.split(' ').map(String::from).collect()
}

/// `steps.csv`'s step, loss, learning rate and gradient norm (not its times).
fn steps(run: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(run.join("steps.csv")).expect("steps.csv");
    let columns = |line: &str| line.split(',').take(4).collect::<Vec<_>>().join(",");
    text.lines().map(columns).collect()
}

/// Asserts that the runs `one` and `two` in `dir` logged the same steps, their losses within
/// 1e-5 of each other (relative).
fn close(dir: &Path, one: &str, two: &str) {
    let losses = |run: &str| -> Vec<f64> {
        steps(&dir.join(run))[1..]
            .iter()
            .map(|line| line.split(',').nth(1).unwrap().parse().unwrap())
            .collect()
    };
    let (one, two) = (losses(one), losses(two));
    assert!(
        !one.is_empty() && one.len() == two.len(),
        "{one:?} vs {two:?}"
    );
    for (step, (a, b)) in one.iter().zip(&two).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "step {}: {a} vs {b}",
            step + 1
        );
    }
}

/// The tensors of a checkpoint's weights, by name (their bytes, not the file's metadata).
fn tensors(run: &Path) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(run.join("last/model.safetensors")).expect("weights");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let mut tensors: Vec<_> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.data().to_vec()))
        .collect();
    tensors.sort();
    tensors
}

/// AdamW (baby, modern) and Muon beside it (modern): the same steps and weights.
#[test]
fn two_ranks_train_the_one_process_run_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let muon = ["--set".to_string(), "train.optimizer=\"muon\"".into()];
    for (config, extra) in [
        ("baby", &[][..]),
        ("modern", &[][..]),
        ("modern", &muon[..]),
    ] {
        let name = format!("{config}{}", if extra.is_empty() { "" } else { "-muon" });
        let (one, two) = (format!("{name}-alone"), format!("{name}-ranked"));
        let run = |out: &str| [args(config, out, 2, 12), extra.to_vec()].concat();
        let out = alone(dir.path(), &run(&one));
        assert!(out.status.success(), "{}", stderr(&out));
        let out = mpirun(dir.path(), 2, &run(&two));
        assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
        // Rank 0 alone speaks: one start line, naming the ranks.
        let said = stdout(&out);
        assert_eq!(said.matches("engine: fused").count(), 1, "{said}");
        assert!(said.contains("2 ranks"), "{said}");
        // Debian's Open MPI allows calls from several threads: the blocks' sums overlap the
        // backward, and the run is still the one process's, bit for bit.
        let overlapped = "each block's gradients summed as its backward ends";
        assert!(said.contains(overlapped), "{said}");
        let (one, two) = (dir.path().join(one), dir.path().join(two));
        assert_eq!(steps(&one), steps(&two), "{name}: steps.csv");
        assert_eq!(steps(&two).len(), 13, "a line a step");
        assert!(tensors(&one) == tensors(&two), "{name}: the weights");
    }
}

#[test]
fn four_micro_batches_over_two_ranks_agree_to_float_rounding() {
    let dir = tempfile::tempdir().unwrap();
    let out = alone(dir.path(), &args("baby", "alone", 4, 12));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = mpirun(dir.path(), 2, &args("baby", "ranked", 4, 12));
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    close(dir.path(), "alone", "ranked");
}

/// Burn's CPU engine over two ranks: each micro-batch's dropout drawn from the step's seed and
/// its index, the gradients added up through the host.
#[test]
fn burns_engine_over_two_ranks_trains_the_one_process_run() {
    let dir = tempfile::tempdir().unwrap();
    let flex = |mut args: Vec<String>| {
        let at = args.iter().position(|a| a == "fused").unwrap();
        args[at] = "flex".into();
        args
    };
    let out = alone(dir.path(), &flex(args("baby", "alone", 2, 8)));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = mpirun(dir.path(), 2, &flex(args("baby", "ranked", 2, 8)));
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    close(dir.path(), "alone", "ranked");
}

/// Burn's engine on a GPU through wgpu (Mesa's lavapipe where there is none) and Burn's CPU
/// engine in bf16: their gradients through the host, the one process's run to float rounding.
#[test]
fn burns_gpu_engine_and_bf16_steps_over_two_ranks_train_the_one_process_run() {
    let dir = tempfile::tempdir().unwrap();
    let on = |backend: &str, extra: &[&str], mut args: Vec<String>| {
        let at = args.iter().position(|a| a == "fused").unwrap();
        args[at] = backend.into();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let bf16 = ["--set", "train.dtype=bf16"];
    for (name, backend, extra) in [("wgpu", "wgpu", &[][..]), ("bf16", "flex", &bf16[..])] {
        let (one, two) = (format!("{name}-alone"), format!("{name}-ranked"));
        let out = alone(dir.path(), &on(backend, extra, args("baby", &one, 2, 6)));
        assert!(out.status.success(), "{}", stderr(&out));
        let out = mpirun(dir.path(), 2, &on(backend, extra, args("baby", &two, 2, 6)));
        assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
        assert!(stdout(&out).contains("2 ranks"), "{}", stdout(&out));
        close(dir.path(), &one, &two);
    }
}

/// LoRA on an int8 base, adapter dropout on, started over two ranks and resumed over two: the
/// one process's run, bit for bit (only the adapters' gradients are added up; rank 0 hands the
/// base, read from the run it names, with the adapters).
#[test]
fn lora_over_two_ranks_trains_and_resumes_the_one_process_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = alone(dir.path(), &args("baby", "base", 2, 5));
    assert!(out.status.success(), "{}", stderr(&out));
    let lora = |out: &str, steps: usize| {
        let mut args = args("baby", out, 2, steps);
        let at = args.iter().position(|a| a == "--config").unwrap();
        args.splice(
            at..at + 2,
            ["--init-from", "base", "--lora", "4"].map(String::from),
        );
        let int8 = ["--weights", "q8_0", "--set", "lora.dropout=0.1"];
        args.extend(int8.map(String::from));
        args
    };
    let out = alone(dir.path(), &lora("whole", 10));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = mpirun(dir.path(), 2, &lora("ranked", 5));
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let out = mpirun(dir.path(), 2, &resume_to("ranked", 10));
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let (whole, ranked) = (dir.path().join("whole"), dir.path().join("ranked"));
    assert_eq!(steps(&whole), steps(&ranked));
    assert_eq!(steps(&ranked).len(), 11, "a line a step");
    let adapters = tensors(&ranked);
    let names: Vec<_> = adapters.iter().map(|(name, _)| name).collect();
    assert_eq!(adapters.len(), 2 * 4, "the adapters alone: {names:?}");
    assert!(tensors(&whole) == adapters);
}

/// Half the steps over two ranks, the rest in one process, and the other way round: the
/// uninterrupted run, bit for bit (rank 0 hands a resumed run's state to the others).
#[test]
fn a_run_resumes_with_another_number_of_ranks_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let out = alone(dir.path(), &args("baby", "whole", 2, 20));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = mpirun(dir.path(), 2, &args("baby", "ranks-first", 2, 10));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = alone(dir.path(), &resume_to("ranks-first", 20));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = alone(dir.path(), &args("baby", "ranks-last", 2, 10));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = mpirun(dir.path(), 2, &resume_to("ranks-last", 20));
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let whole = dir.path().join("whole");
    for run in ["ranks-first", "ranks-last"] {
        let run = dir.path().join(run);
        assert_eq!(steps(&whole), steps(&run), "{}", run.display());
        assert!(tensors(&whole) == tensors(&run), "{}", run.display());
    }
}

/// A rank killed mid-run ends the whole job (none left waiting in an all-reduce), the last
/// checkpoint is whole, and resuming it gives the uninterrupted run.
#[test]
fn a_killed_rank_ends_the_job_and_its_last_checkpoint_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let command = mpirun_command(dir.path(), 2, &args("baby", "killed", 2, 400));
    // TINY checkpoints every 5 steps: past step 12, step 10's checkpoint is written.
    let job = Watched::spawn_until(command, |line| line.starts_with("step 12/"));
    let rank_1 = rank_pid(dir.path(), 1).expect("rank 1 runs");
    let killed = Command::new("kill")
        .args(["-KILL", &rank_1.to_string()])
        .status();
    assert!(killed.unwrap().success());
    let (code, _, err) = job.wait();
    assert_ne!(code, Some(0), "the job failed: {err}");
    assert!(ranks_end(dir.path()), "a rank is left running");
    let step = resumes_as_if_never_stopped(dir.path(), "killed");
    // Step 10's, or a later one rank 0 saved when the launcher stopped it between steps.
    assert!(step >= 10, "checkpoint at step {step}");
}

/// Resumes the run `run` in `dir` from its last checkpoint to 5 steps past it, and asserts it
/// then equals a run never stopped (bit for bit: steps.csv and the weights); returns the step
/// the checkpoint was at.
fn resumes_as_if_never_stopped(dir: &Path, run: &str) -> usize {
    let state = std::fs::read_to_string(dir.join(run).join("last/state.json")).unwrap();
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    let step = state["step"].as_u64().unwrap() as usize;
    let out = alone(dir, &resume_to(run, step + 5));
    assert!(out.status.success(), "{}", stderr(&out));
    let whole = format!("{run}-whole");
    let out = alone(dir, &args("baby", &whole, 2, step + 5));
    assert!(out.status.success(), "{}", stderr(&out));
    let (whole, run) = (dir.join(whole), dir.join(run));
    assert_eq!(steps(&whole), steps(&run));
    assert!(tensors(&whole) == tensors(&run));
    step
}

/// Ctrl-C to `mpirun` (which passes it on to every rank) saves once and ends every rank, as
/// one process does; resuming gives the uninterrupted run.
#[test]
fn ctrl_c_to_mpirun_saves_once_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let command = mpirun_command(dir.path(), 2, &args("baby", "stopped", 2, 400));
    let job = Watched::spawn_until(command, |line| line.starts_with("step 7/"));
    job.signal("INT");
    let (code, lines, err) = job.wait();
    assert_ne!(code, Some(0), "{err}");
    let saved: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("interrupted at step"))
        .collect();
    assert_eq!(saved.len(), 1, "saved once: {lines:#?}\n{err}");
    assert!(ranks_end(dir.path()), "a rank is left running");
    // Saved where it stopped (the signal reaches the ranks a moment after `mpirun`).
    resumes_as_if_never_stopped(dir.path(), "stopped");
}

/// Whether both ranks of the job in `dir` are gone within 30 s of `mpirun` ending (it may end
/// as it kills them, not after): the bound on a job whose rank died.
fn ranks_end(dir: &Path) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while rank_pid(dir, 0).is_some() || rank_pid(dir, 1).is_some() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    true
}

/// The process of rank `rank` of a job running in `dir`, if one runs.
fn rank_pid(dir: &Path, rank: usize) -> Option<u32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cwd = std::fs::read_link(entry.path().join("cwd")).ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let ours = cwd == dir.canonicalize().ok()?
                && environ.split(|&b| b == 0).any(|v| v == want.as_bytes());
            ours.then_some(pid)
        })
}

/// `bench --all-reduce` adds up what a step over ranks does: every trained parameter of a
/// full run, the adapters alone of a LoRA run.
#[test]
fn the_all_reduce_bench_times_the_trained_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let bench = |extra: &[&str]| -> serde_json::Value {
        let mut args = ["bench", "--all-reduce", "--json", "--config", "baby"]
            .map(String::from)
            .to_vec();
        args.extend(["--iters", "2", "--warmup", "0"].map(String::from));
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = mpirun(dir.path(), 2, &args);
        assert!(out.status.success(), "{}", stderr(&out));
        let said = stdout(&out);
        let lines: Vec<_> = said.lines().collect();
        assert_eq!(lines.len(), 1, "rank 0 alone prints: {said}");
        serde_json::from_str(lines[0]).unwrap()
    };
    // The model's parameters, as one process's bench counts them.
    let out = alone(
        dir.path(),
        &[
            "bench",
            "--json",
            "--config",
            "baby",
            "--iters",
            "1",
            "--sample-tokens",
            "0",
        ]
        .map(String::from),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let step: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let full = bench(&[]);
    assert_eq!(full["ranks"], 2);
    assert_eq!(full["trained_params"], step["params"]);
    let params = full["trained_params"].as_u64().unwrap();
    assert_eq!(full["bytes"].as_u64().unwrap(), 4 * params);
    assert!(full["per_tensor_s"].as_f64().unwrap() > 0.0);
    assert!(full["one_buffer_s"].as_f64().unwrap() > 0.0);
    assert!(full["overlapped_s"].as_f64().unwrap() > 0.0);
    // Rank 4 on baby's four matrices a block (width 128: qkv 128→384, proj 128→128, fc
    // 128→512, proj 512→128), A and B each: rank × (inputs + outputs) a matrix.
    let lora = bench(&["--set", "lora.rank=4"]);
    let per_block = 4 * ((128 + 384) + (128 + 128) + (128 + 512) + (512 + 128));
    assert_eq!(lora["trained_params"], 4 * per_block);
    assert_eq!(lora["tensors"], 4 * 4 * 2);
}

#[test]
fn micro_batches_that_cannot_be_dealt_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = mpirun(dir.path(), 2, &args("baby", "odd", 3, 12));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("multiple of 2"), "{err}");
    assert!(err.contains("train.grad_accum=4"), "says what works: {err}");
    assert!(!dir.path().join("odd").exists(), "nothing written");
}

#[test]
fn a_launcher_and_mpi_that_disagree_are_named_both() {
    // The launcher's variables say two ranks; MPI, started alone, counts one.
    let dir = tempfile::tempdir().unwrap();
    let out = common::command(dir.path(), &args("baby", "run", 2, 12))
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .env("OMPI_COMM_WORLD_RANK", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("says 2 ranks but MPI counts 1"), "{err}");
    assert!(!dir.path().join("run").exists());
}
