#!/usr/bin/env python3
"""tinygpt's CPU decoding beside llama.cpp's on the same GGUF models, machine and threads.

For each shape (SmolLM2-135M's: 30 layers, width 576, 9 query and 3 key/value heads, SwiGLU
1536, θ 100000, tied, 49,152 embedding rows; and the shakespeare-char preset's, with GELU's tanh
form so that llama.cpp computes it), the script makes a run with random weights (one training
step), exports it as f32 and q8_0 GGUF, has llama.cpp quantise the f32 file to Q4_0 and Q5_0
(as it chooses each tensor's type, and pure), Q4_K_M and Q5_K_M (`llama_model_quantize`), and
times:

- llama.cpp (llama-cpp-python, `n_threads` 2, its default f16 KV cache): a prompt
  of P tokens in one batch (prompt tokens/s), then, from a one-token prompt, N tokens one at a
  time (decode tokens/s, greedy), best of 3;
- tinygpt (`--backend fused`): `bench --iters 0 --prompt-tokens P --sample-tokens N` on the
  run's config, `--weights f32`, `q8_0`, `q5_0` and `q4_0` (every matrix in the type: the bytes
  of llama.cpp's pure Q5_0 and Q4_0 files, `q5_0-pure` and `q4_0-pure`; a token's products
  split over every core by outputs, a prompt's by rows); and llama.cpp's Q4_K_M, Q5_K_M, Q4_0
  and Q5_0 files themselves (the last two as llama.cpp writes them, the head in Q8_0 at this
  width), imported, with `generate --weights file` (each matrix in the file's type and its
  own blocks): N tokens from a one-token prompt, timed from the first
  new token's text to the last's, and the prompt of P tokens, timed from its echo (printed once
  the model is loaded) to the end of one new token, best of 3, with the peak resident memory;
  and beside the Q4_K_M file, `generate --weights q8_0` of the same imported model, its runs
  taken in turn with the file's (tinygpt's own q8_0 timed as the file is: `bench` and
  `generate` give different figures, and the machine's moments move both);
- the machine's read bandwidth: numpy's sum over 1 GiB of f32, at 1 and 2 threads (each thread
  its own half), best of 3, so each decode figure can say what share of the ceiling it reads
  (weights' bytes a token × tokens/s; for llama.cpp the file's size, which for these tied
  models is the bytes a token reads to within the norms).

SmolLM2-360M's and 1.7B's shapes (`smollm2-360m`, `smollm2-1.7b`) start from a Hugging Face
directory that `scripts/smollm2-shape.py OUT CORPUS 360M|1.7B` made (`--hf DIR`, with one
`--only`): the script imports it, exports it as q8_0 (tinygpt's Q8_0 is llama.cpp's, bit for bit;
f32 at 1.7B would not fit beside the model in 23 GiB), has llama.cpp quantise that to Q4_K_M
(`allow_requantize`) and times llama.cpp's Q8_0 and Q4_K_M files, tinygpt's `bench --weights
q8_0` and the Q4_K_M file imported (`generate --weights file`, with its peak resident memory).

`--rounds R` (SmolLM2-135M's shape) times only the comparisons on the same file, R rounds, each
llama.cpp's decode then tinygpt's (`generate --weights file`, and `--weights q8_0` of the Q4_K_M
file's model) back to back, best of 3 each: llama.cpp's Q4_0 and Q4_K_M files. On a shared
machine whose read rate moves from minute to minute, ratios of figures taken minutes apart swing
by a quarter; each round's pair is taken within seconds, and the script prints every round and
the median of the rounds' ratios.

The machine's other work distorts the figures: run nothing else meanwhile. Not for CI. From the repository root:

    .llama/bin/python scripts/gguf-side-by-side.py --tinygpt target/release/tinygpt \\
        --corpus input.txt
    .llama/bin/python scripts/gguf-side-by-side.py --tinygpt target/release/tinygpt \\
        --corpus input.txt --only smollm2-1.7b --hf SmolLM2-1.7B-shape
    .llama/bin/python scripts/gguf-side-by-side.py --tinygpt target/release/tinygpt \\
        --corpus input.txt --rounds 5
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp
import numpy as np

SHAPES = {
    # name: (settings, prompt tokens P, new tokens N)
    "smollm2-135m": ([
        "model.n_layer=30", "model.n_head=9", "model.n_kv_head=3", "model.n_embd=576",
        'model.mlp="swiglu"', "model.mlp_hidden=1536", 'model.position="rope"',
        'model.norm="rms"', "model.bias=false", "model.tie_embeddings=true",
        "model.rope_theta=100000", "model.block_size=1024", "model.layer_norm_eps=1e-5",
        'data.tokenizer="bpe"', "data.bpe_vocab_size=8192", "model.vocab_size=49152",
    ], 512, 128),
    "shakespeare-char": ([
        "model.n_layer=6", "model.n_head=6", "model.n_embd=384", "model.block_size=256",
        "model.bias=false", 'model.mlp="gelu_tanh"', 'data.tokenizer="char"',
    ], 128, 64),
}
# Shapes made from a Hugging Face directory (`--hf`): (prompt tokens P, new tokens N).
HF_SHAPES = {"smollm2-360m": (512, 128), "smollm2-1.7b": (512, 64)}
THREADS = 2


def run(args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


def make(tinygpt, corpus, name, work):
    settings, _, _ = SHAPES[name]
    args = [tinygpt, "train", "--backend", "fused", "--data", corpus, "--out", str(work / "run"),
            "--max-iters", "1"]
    for s in settings + ["train.batch_size=1", "train.eval_iters=1", "train.eval_interval=1",
                         "train.sample_tokens=0", "model.dropout=0"]:
        args += ["--set", s]
    run(args)
    for dtype in ["f32", "q8_0"]:
        run([tinygpt, "export", "--checkpoint", str(work / "run"), "--which", "last", "--format",
             "gguf", "--dtype", dtype, "--out", str(work / f"{dtype}.gguf")])


def prompt_of(gguf, corpus, n_prompt):
    """A prompt of exactly `n_prompt` tokens: the corpus's first tokens as llama.cpp cuts them
    with `gguf`'s vocabulary, their ids and their text."""
    text = Path(corpus).read_text(encoding="utf-8")[: n_prompt * 8]
    probe = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    ids = probe.tokenize(text.encode(), add_bos=False, special=False)[:n_prompt]
    prompt = probe.detokenize(ids).decode("utf-8", errors="ignore")
    probe.close()
    return ids, prompt


def llama_cpp_speed(gguf, prompt_ids, new):
    # n_batch = n_ctx: llama-cpp-python keeps the last logits in a row of an n_batch-row array,
    # indexed by position.
    n_ctx = len(prompt_ids) + new + 8
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=n_ctx, n_batch=n_ctx, n_threads=THREADS,
                          n_threads_batch=THREADS, verbose=False)
    best_pp, best_tg = 0.0, 0.0
    for _ in range(3):
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt_ids)
        pp = len(prompt_ids) / (time.perf_counter() - start)
        # The decode from a one-token prompt, at a short context as tinygpt's `bench` times it
        # (and llama-bench's tg128), not after the prompt's P cached tokens.
        llm.reset()
        llm.eval(prompt_ids[:1])
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        start = time.perf_counter()
        for _ in range(new):
            llm.eval([token])
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        tg = new / (time.perf_counter() - start)
        best_pp, best_tg = max(best_pp, pp), max(best_tg, tg)
    # Freed before anything else is timed: llama.cpp's threads poll for work a while after it.
    llm.close()
    del llm
    gc.collect()
    time.sleep(2)
    return best_pp, best_tg


def read_bandwidth(threads):
    """GB/s of a read-only sum over 1 GiB of f32 split among `threads` threads, best of 3."""
    from concurrent.futures import ThreadPoolExecutor
    data = np.ones(1 << 28, dtype=np.float32)
    parts = np.array_split(data, threads)
    best = 0.0
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(3):
            start = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = max(best, data.nbytes / (time.perf_counter() - start) / 1e9)
    return best


def tinygpt_speed(tinygpt, run_dir, n_prompt, new, weights):
    """`bench` on the run's config (its shape; bench's weights are random, which does not change
    the speed): a prompt of P tokens read, and N tokens sampled from a one-token prompt with the
    KV cache, each timed in the process on a second pass."""
    bench = run([tinygpt, "bench", "--config", str(run_dir / "config.toml"), "--backend",
                 "fused", "--iters", "0", "--sample-tokens", str(new), "--prompt-tokens",
                 str(n_prompt), "--weights", weights, "--json"])
    result = json.loads(bench.stdout.strip().splitlines()[-1])
    return (result["prompt_tokens_per_s"], result["sample_tokens_per_s"],
            result["weight_bytes_per_token"])


def tinygpt_file_speed(tinygpt, gguf, work, new, prompt, weights=("file",)):
    """`generate --weights W` of the GGUF file `gguf` imported, for each W of `weights` (`file`:
    each matrix in the file's type; `q8_0`: the imported model's values quantised as tinygpt's
    own q8_0), the runs of each W taken in turn so that the machine's moments fall on all of
    them alike: a dict W -> (tokens/s of `new` tokens after the first, from the times its
    output arrives (the first token's text, then the last's: the load and the first token left
    out, as llama.cpp's decode figure leaves out its load and prompt), best of 3; the largest
    peak resident memory of those runs, in bytes; the prompt's tokens/s for `prompt` (text of
    P tokens, a pair (text, P)): from the echo of the prompt, which `generate` prints once the
    model is loaded, to the end of one new token, best of 3). (Timing whole runs and
    subtracting a one-token run's, as this script did until 2026-12-07, is lost in the load's
    noise at 1.7B.)"""
    imported = work / f"imported-{gguf.stem}"
    if not imported.exists():
        run([tinygpt, "import", "--from", str(gguf), "--out", str(imported)])

    def generate(text, tokens, w):
        """When the echo of `text` arrived, then the first byte after it, then the last byte."""
        # Peak memory by GNU time: a child's own `ru_maxrss` counts the Python process it was
        # forked from (Linux keeps the high-water mark across `exec`).
        peak_file = work / "peak.txt"
        proc = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", str(peak_file), tinygpt,
                                 "generate", "--checkpoint", str(imported), "--prompt", text,
                                 "--max-new-tokens", str(tokens), "--temperature", "0",
                                 "--backend", "fused", "--weights", w],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
        echo, seen, times = len(text.encode()), 0, []
        while proc.stdout.read(1):
            seen += 1
            if seen in (1, echo + 1):
                times.append(time.perf_counter())
            last = time.perf_counter()
        assert proc.wait() == 0 and len(times) >= 2, f"generate exited {proc.returncode}"
        return times[0], times[1], last, int(peak_file.read_text().split()[-1]) * 1024

    results = {w: (0.0, 0, 0.0) for w in weights}
    for _ in range(3):
        for w in weights:
            best, peak, best_pp = results[w]
            _, first, last, rss = generate("The", new + 1, w)
            peak = max(peak, rss)
            best = max(best, new / (last - first))
            echoed, _, last, rss = generate(prompt[0], 1, w)
            peak = max(peak, rss)
            best_pp = max(best_pp, prompt[1] / (last - echoed))
            results[w] = (best, peak, best_pp)
    return results


def rounds(args):
    """`--rounds`: the same-file comparisons of SmolLM2-135M's shape, each round's figures taken
    back to back (see the module's notes): a row a round and file, then the medians."""
    name = "smollm2-135m"
    _, _, new = SHAPES[name]
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        make(args.tinygpt, args.corpus, name, work)
        ids, _ = prompt_of(work / "f32.gguf", args.corpus, 1)
        ratios = {}
        for dtype, ftype in [("q4_0", 2), ("q4_k_m", 15)]:
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype, params.nthread = ftype, THREADS
            code = llama_cpp.llama_model_quantize(str(work / "f32.gguf").encode(),
                                                  str(work / f"{dtype}.gguf").encode(), params)
            assert code == 0, f"llama_model_quantize: {code}"
        for r in range(args.rounds):
            for dtype in ["q4_0", "q4_k_m"]:
                gguf = work / f"{dtype}.gguf"
                _, llama = llama_cpp_speed(gguf, ids, new)
                weights = ("file", "q8_0") if dtype == "q4_k_m" else ("file",)
                speeds = tinygpt_file_speed(args.tinygpt, gguf, work, new, ("The", 1), weights)
                row = {"shape": name, "round": r + 1, "file": dtype, "new_tokens": new,
                       "read_gb_s": round(read_bandwidth(THREADS), 1),
                       "llama.cpp_tok_s": round(llama, 1),
                       "tinygpt_tok_s": round(speeds["file"][0], 1),
                       "ratio": round(speeds["file"][0] / llama, 3)}
                ratios.setdefault(dtype, []).append(row["ratio"])
                if "q8_0" in speeds:
                    row["tinygpt_q8_0_tok_s"] = round(speeds["q8_0"][0], 1)
                    row["file_over_q8_0"] = round(speeds["file"][0] / speeds["q8_0"][0], 3)
                    ratios.setdefault("q4_k_m over q8_0", []).append(row["file_over_q8_0"])
                print(json.dumps(row), flush=True)
    for what, values in ratios.items():
        print(json.dumps({"shape": name, "ratio": what, "rounds": len(values),
                          "median": round(float(np.median(values)), 3),
                          "min": min(values), "max": max(values)}), flush=True)
    return 0


def hf_shape(args, name, bandwidth):
    """The rows of a shape made from `--hf`'s directory (see the module's notes)."""
    n_prompt, new = HF_SHAPES[name]
    rows = []
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        run([args.tinygpt, "import", "--from", args.hf, "--out", str(work / "run")])
        run([args.tinygpt, "export", "--checkpoint", str(work / "run"), "--format", "gguf",
             "--dtype", "q8_0", "--out", str(work / "q8_0.gguf")])
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.nthread, params.allow_requantize = 15, THREADS, True
        code = llama_cpp.llama_model_quantize(str(work / "q8_0.gguf").encode(),
                                              str(work / "q4_k_m.gguf").encode(), params)
        assert code == 0, f"llama_model_quantize: {code}"
        ids, prompt = prompt_of(work / "q8_0.gguf", args.corpus, n_prompt)
        share = lambda size, tg: round(size * tg / 1e9 / bandwidth[THREADS], 2)
        for dtype in ["q8_0", "q4_k_m"]:
            gguf = work / f"{dtype}.gguf"
            pp, tg = llama_cpp_speed(gguf, ids, new)
            rows.append({"shape": name, "engine": "llama.cpp", "weights": dtype,
                         "threads": THREADS, "prompt_tokens": n_prompt,
                         "prompt_tok_s": round(pp, 1), "new_tokens": new,
                         "decode_tok_s": round(tg, 1), "file_bytes": gguf.stat().st_size,
                         "share_of_read_ceiling": share(gguf.stat().st_size, tg)})
        pp, tg, size = tinygpt_speed(args.tinygpt, work / "run", n_prompt, new, "q8_0")
        rows.append({"shape": name, "engine": "tinygpt", "weights": "q8_0",
                     "threads": os.cpu_count(), "prompt_tokens": n_prompt,
                     "prompt_tok_s": round(pp, 1), "new_tokens": new,
                     "decode_tok_s": round(tg, 1), "bytes_per_token": size,
                     "share_of_read_ceiling": share(size, tg)})
        # The run's f32 weights are not needed past here: room on the disk for the import.
        subprocess.run(["rm", "-rf", str(work / "run")], check=True)
        gguf = work / "q4_k_m.gguf"
        speeds = tinygpt_file_speed(args.tinygpt, gguf, work, new, (prompt, n_prompt))
        tg, peak, pp = speeds["file"]
        rows.append({"shape": name, "engine": "tinygpt", "weights": "q4_k_m file",
                     "threads": os.cpu_count(), "prompt_tokens": n_prompt,
                     "prompt_tok_s": round(pp, 1), "new_tokens": new, "decode_tok_s": round(tg, 1),
                     "file_bytes": gguf.stat().st_size, "generate_peak_rss": peak})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tinygpt", required=True)
    parser.add_argument("--corpus", required=True, help="text to train the tokenizers on")
    parser.add_argument("--only", choices=sorted(SHAPES) + sorted(HF_SHAPES), action="append")
    parser.add_argument("--hf", help="a Hugging Face directory of the one --only shape "
                        "(smollm2-360m, smollm2-1.7b: scripts/smollm2-shape.py made it)")
    parser.add_argument("--work", help="where to put the files (default: the system's temp)")
    parser.add_argument("--rounds", type=int, help="only the same-file comparisons of "
                        "smollm2-135m, this many rounds, each pair back to back")
    args = parser.parse_args()
    if args.rounds is not None:
        if args.rounds < 1 or args.only or args.hf:
            parser.error("--rounds takes a count of 1 or more, without --only or --hf")
        return rounds(args)
    hf = [name for name in args.only or [] if name in HF_SHAPES]
    if hf and (not args.hf or len(args.only) != 1):
        parser.error(f"{hf[0]} is made from --hf DIR, and alone in --only")
    bandwidth = {t: read_bandwidth(t) for t in (1, 2)}
    for t, gb_s in bandwidth.items():
        print(json.dumps({"engine": "memory", "threads": t, "read_gb_s": round(gb_s, 1)}),
              flush=True)
    if hf:
        for row in hf_shape(args, hf[0], bandwidth):
            print(json.dumps(row), flush=True)
        return 0
    rows = []
    for name in args.only or SHAPES:
        _, n_prompt, new = SHAPES[name]
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            make(args.tinygpt, args.corpus, name, work)
            ids, prompt = prompt_of(work / "f32.gguf", args.corpus, n_prompt)
            share = lambda size, tg, threads: round(size * tg / 1e9 / bandwidth[threads], 2)
            # llama.cpp's own quantiser: LLAMA_FTYPE_MOSTLY_Q4_0 and _Q5_0 as it writes them (the
            # head in Q6_K, at a width that is not a multiple of 256 Q8_0) and pure (every matrix
            # in the type: the bytes of tinygpt's `--weights q4_0` and `q5_0`), _Q4_K_M and
            # _Q5_K_M (at such a width mostly Q5_0 and Q5_1, the embedding Q8_0).
            made = [("q4_0", 2, False), ("q5_0", 8, False), ("q4_0-pure", 2, True),
                    ("q5_0-pure", 8, True), ("q4_k_m", 15, False), ("q5_k_m", 17, False)]
            for dtype, ftype, pure in made:
                params = llama_cpp.llama_model_quantize_default_params()
                params.ftype, params.nthread, params.pure = ftype, THREADS, pure
                code = llama_cpp.llama_model_quantize(str(work / "f32.gguf").encode(),
                                                      str(work / f"{dtype}.gguf").encode(), params)
                assert code == 0, f"llama_model_quantize: {code}"
            first = len(rows)
            for dtype in ["f32", "q8_0"] + [m[0] for m in made]:
                gguf = work / f"{dtype}.gguf"
                pp, tg = llama_cpp_speed(gguf, ids, new)
                rows.append({"shape": name, "engine": "llama.cpp", "weights": dtype,
                             "threads": THREADS, "prompt_tokens": n_prompt,
                             "prompt_tok_s": round(pp, 1), "new_tokens": new,
                             "decode_tok_s": round(tg, 1), "bytes_per_token": gguf.stat().st_size,
                             "share_of_read_ceiling": share(gguf.stat().st_size, tg, THREADS)})
            for weights in ["f32", "q8_0", "q5_0", "q4_0"]:
                pp, tg, size = tinygpt_speed(args.tinygpt, work / "run", n_prompt, new, weights)
                rows.append({"shape": name, "engine": "tinygpt", "weights": weights,
                             "threads": os.cpu_count(), "prompt_tokens": n_prompt,
                             "prompt_tok_s": round(pp, 1), "new_tokens": new,
                             "decode_tok_s": round(tg, 1), "bytes_per_token": size,
                             "share_of_read_ceiling": share(size, tg, min(os.cpu_count(), 2))})
            # llama.cpp's own files, each decoded by tinygpt as the file stores it: the same
            # bytes a token as llama.cpp's figure for that file.
            for dtype in ["q4_k_m", "q5_k_m", "q4_0", "q5_0"]:
                gguf = work / f"{dtype}.gguf"
                # Beside the Q4_K_M file, tinygpt's own q8_0 of the same imported model, timed
                # the same way in the same minutes: the "≥ 1.3× tinygpt's own q8_0".
                weights = ("file", "q8_0") if dtype == "q4_k_m" else ("file",)
                speeds = tinygpt_file_speed(args.tinygpt, gguf, work, new, (prompt, n_prompt),
                                            weights)
                for w, (tg, peak, pp) in speeds.items():
                    label = f"{dtype} file" if w == "file" else f"{w} of the {dtype} file's model"
                    rows.append({"shape": name, "engine": "tinygpt", "weights": label,
                                 "threads": os.cpu_count(), "prompt_tokens": n_prompt,
                                 "prompt_tok_s": round(pp, 1), "new_tokens": new,
                                 "decode_tok_s": round(tg, 1), "generate_peak_rss": peak})
            for row in rows[first:]:
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
