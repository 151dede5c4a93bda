#!/usr/bin/env python3
"""The GGUF files people download, quantised by llama.cpp itself, imported into tinygpt.

For two Llama-shaped models it makes a run, exports it as f32 GGUF, has llama.cpp quantise that
file (llama-cpp-python's `llama_model_quantize`) to Q4_0, Q4_K_M, Q5_K_M, Q6_K and Q8_0, and for
each file prints the ggml types it holds (llama.cpp's choice per tensor, its fallbacks for rows
that are not a multiple of 256 included), then imports it (`tinygpt import`, dequantised to f32)
and compares:

- the logits of a prompt: tinygpt's (`tinygpt logits`) against llama.cpp's on the same file
  (llama.cpp multiplies the quantised weights with activations it quantises too, so the two
  differ by that rounding): the largest difference in a row over that row's largest magnitude;
- the loss over the validation text (`tinygpt eval`) of the import against the f32 model's.

Shapes: `trained` (4 layers, width 256, SwiGLU 768, a 512-token BPE vocabulary: every row a
multiple of 256, so Q4_K_M holds real Q4_K and Q6_K; trained STEPS steps on the corpus) and
`smollm2-135m` (SmolLM2-135M's shape, width 576, random weights after one step: its k-quants
fall back to Q5_0, Q5_1 and Q8_0, as llama.cpp writes SmolLM2's own Q4_K_M). Not for CI
(llama-cpp-python compiles llama.cpp). From the repository root:

    python -m venv .llama && .llama/bin/pip install llama-cpp-python numpy gguf
    cargo build --release
    .llama/bin/python scripts/gguf-quantised-import.py --tinygpt target/release/tinygpt \\
        --corpus input.txt
"""

import argparse
import collections
import json
import subprocess
import tempfile
from pathlib import Path

import gguf
import llama_cpp
import numpy as np

COMMON = ['model.position="rope"', 'model.norm="rms"', "model.bias=false",
          'model.mlp="swiglu"', "model.dropout=0", 'data.tokenizer="bpe"',
          "train.eval_iters=1", "train.sample_tokens=0"]
SHAPES = {
    "trained": ["model.n_layer=4", "model.n_head=4", "model.n_kv_head=2", "model.n_embd=256",
                "model.mlp_hidden=768", "model.block_size=128", "model.tie_embeddings=true",
                "data.bpe_vocab_size=512", "model.vocab_size=512", "train.batch_size=16"],
    "smollm2-135m": ["model.n_layer=30", "model.n_head=9", "model.n_kv_head=3",
                     "model.n_embd=576", "model.mlp_hidden=1536", "model.block_size=1024",
                     "model.tie_embeddings=true", "model.rope_theta=100000",
                     "data.bpe_vocab_size=8192", "model.vocab_size=49152",
                     "train.batch_size=1"],
}
# llama.cpp's file types (llama.h's `llama_ftype`).
FTYPES = {"Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}


def run(args):
    return subprocess.run([str(a) for a in args], check=True, capture_output=True,
                          text=True).stdout


def make(tinygpt, corpus, shape, steps, work):
    out = work / shape
    iters = steps if shape == "trained" else 1
    args = [tinygpt, "train", "--backend", "fused", "--data", corpus, "--out", out,
            "--max-iters", iters, "--set", f"train.eval_interval={iters}"]
    for s in COMMON + SHAPES[shape]:
        args += ["--set", s]
    run(args)
    run([tinygpt, "export", "--checkpoint", out, "--which", "last", "--format", "gguf",
         "--dtype", "f32", "--out", work / f"{shape}-f32.gguf"])
    return out


def quantise(f32_file, name, out):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[name]
    params.nthread = 2
    code = llama_cpp.llama_model_quantize(str(f32_file).encode(), str(out).encode(), params)
    assert code == 0, f"llama_model_quantize {name}: {code}"


def types(file):
    counts = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(file).tensors)
    return dict(sorted(counts.items()))


def llama_logits(file, tokens):
    llm = llama_cpp.Llama(model_path=str(file), n_ctx=len(tokens) + 8, n_batch=len(tokens) + 8,
                          n_threads=2, logits_all=True, verbose=False)
    llm.eval(tokens)
    scores = np.array(llm.scores[:len(tokens)], dtype=np.float64)
    llm.close()
    return scores


def tinygpt_logits(tinygpt, run_dir, tokens, vocab):
    out = json.loads(run([tinygpt, "logits", "--checkpoint", run_dir, "--backend", "fused",
                          "--tokens", ",".join(map(str, tokens))]))
    return np.array(out["logits"], dtype=np.float64).reshape(len(tokens), vocab)


def eval_loss(tinygpt, run_dir, text, which="best"):
    said = run([tinygpt, "eval", "--checkpoint", run_dir, "--which", which, "--backend",
                "fused", "--data", text])
    return float(said.split("| loss ")[1].split()[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tinygpt", required=True)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--steps", type=int, default=600, help="training steps of `trained`")
    parser.add_argument("--only", choices=sorted(SHAPES), action="append")
    args = parser.parse_args()
    text = Path(args.corpus).read_text()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        val = work / "val.txt"
        val.write_text(text[int(len(text) * 0.9):][:20000])
        for shape in args.only or SHAPES:
            run_dir = make(args.tinygpt, args.corpus, shape, args.steps, work)
            f32_file = work / f"{shape}-f32.gguf"
            prompt = text[:400]
            llm = llama_cpp.Llama(model_path=str(f32_file), vocab_only=True, verbose=False)
            tokens = llm.tokenize(prompt.encode(), add_bos=False)[:64]
            vocab = llm.n_vocab()
            llm.close()
            base = eval_loss(args.tinygpt, run_dir, val, "last")
            print(json.dumps({"shape": shape, "file": "F32", "eval_loss": base}), flush=True)
            for name in FTYPES:
                q_file = work / f"{shape}-{name}.gguf"
                quantise(f32_file, name, q_file)
                imported = work / f"{shape}-{name}-run"
                run([args.tinygpt, "import", "--from", q_file, "--out", imported])
                theirs = llama_logits(q_file, tokens)
                mine = tinygpt_logits(args.tinygpt, imported, tokens, vocab)
                rows = np.abs(mine - theirs).max(axis=1) / np.abs(theirs).max(axis=1)
                loss = eval_loss(args.tinygpt, imported, val)
                print(json.dumps({
                    "shape": shape, "file": name, "mb": round(q_file.stat().st_size / 1e6, 1),
                    "types": types(q_file), "logits_vs_llama_cpp_worst_row": float(rows.max()),
                    "logits_vs_llama_cpp_median_row": float(np.median(rows)),
                    "eval_loss": loss, "vs_f32": round(loss / base - 1, 5),
                }), flush=True)


if __name__ == "__main__":
    main()
