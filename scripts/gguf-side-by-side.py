#!/usr/bin/env python3
"""tinygpt's CPU decoding beside llama.cpp's on the same GGUF models, machine and threads.

For each shape (SmolLM2-135M's: 30 layers, width 576, 9 query and 3 key/value heads, SwiGLU
1536, θ 100000, tied, 49,152 embedding rows; and the shakespeare-char preset's, with GELU's tanh
form so that llama.cpp computes it), the script makes a run with random weights (one training
step), exports it as f32 and q8_0 GGUF, imports the q8_0 file back (tinygpt decodes the
dequantised weights in f32), and times:

- llama.cpp (llama-cpp-python, `n_threads` 2, its default f16 KV cache): a prompt
  of P tokens in one batch (prompt tokens/s), then N tokens one at a time (decode tokens/s,
  greedy), best of 3;
- tinygpt (`--backend fused`, every core): `bench --iters 0 --prompt-tokens P --sample-tokens N`
  on the run's config, and on the imported q8_0 run's (the same shape: its f32 decoding of the
  dequantised weights costs what f32 does; the two rows show this machine's run-to-run spread).

The machine's other work distorts the figures: run nothing else meanwhile. Not for CI. From the repository root:

    .llama/bin/python scripts/gguf-side-by-side.py --tinygpt target/release/tinygpt \\
        --corpus input.txt
"""

import argparse
import gc
import json
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
    run([tinygpt, "import", "--from", str(work / "q8_0.gguf"), "--out", str(work / "deq")])


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


def tinygpt_speed(tinygpt, run_dir, n_prompt, new):
    """`bench` on the run's config (its shape; bench's weights are random, which does not change
    the speed): a prompt of P tokens read, and N tokens sampled from a one-token prompt with the
    KV cache, each timed in the process on a second pass."""
    bench = run([tinygpt, "bench", "--config", str(run_dir / "config.toml"), "--backend",
                 "fused", "--iters", "0", "--sample-tokens", str(new), "--prompt-tokens",
                 str(n_prompt), "--json"])
    result = json.loads(bench.stdout.strip().splitlines()[-1])
    return result["prompt_tokens_per_s"], result["sample_tokens_per_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tinygpt", required=True)
    parser.add_argument("--corpus", required=True, help="text to train the tokenizers on")
    parser.add_argument("--only", choices=sorted(SHAPES), action="append")
    args = parser.parse_args()
    rows = []
    for name in args.only or SHAPES:
        _, n_prompt, new = SHAPES[name]
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            make(args.tinygpt, args.corpus, name, work)
            # A prompt of exactly n_prompt tokens: the corpus's first tokens, as llama.cpp cuts it.
            text = Path(args.corpus).read_text(encoding="utf-8")[: n_prompt * 8]
            probe = llama_cpp.Llama(model_path=str(work / "f32.gguf"), vocab_only=True,
                                    verbose=False)
            ids = probe.tokenize(text.encode(), add_bos=False, special=False)[:n_prompt]
            probe.close()
            for dtype in ["f32", "q8_0"]:
                pp, tg = llama_cpp_speed(work / f"{dtype}.gguf", ids, new)
                rows.append({"shape": name, "engine": "llama.cpp", "weights": dtype,
                             "prompt_tokens": n_prompt, "prompt_tok_s": round(pp, 1),
                             "new_tokens": new, "decode_tok_s": round(tg, 1)})
            for label, run_dir in [("f32", work / "run"), ("q8_0 dequantised to f32", work / "deq")]:
                pp, tg = tinygpt_speed(args.tinygpt, run_dir, n_prompt, new)
                rows.append({"shape": name, "engine": "tinygpt", "weights": label,
                             "prompt_tokens": n_prompt, "prompt_tok_s": round(pp, 1),
                             "new_tokens": new, "decode_tok_s": round(tg, 1)})
            for row in rows[-4:]:
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
