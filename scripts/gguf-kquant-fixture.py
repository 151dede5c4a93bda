#!/usr/bin/env python3
"""A "Q4_K_M" and a "Q5_K_M" file made by llama.cpp's own quantiser, and llama.cpp's logits on
each, for `crates/trainer/tests/gguf_kquants.rs`: tinygpt imports the files, keeps their Q4_K,
Q5_K and Q6_K matrices in their blocks and must compute what llama.cpp computes from them.

It trains a small Llama-shaped run 256 wide (two layers, grouped-query attention, SwiGLU 512
wide, an untied head: every matrix's rows a multiple of 256, so llama.cpp writes them as
k-quants), exports it as f32 GGUF with tinygpt, has llama.cpp quantise that to Q4_K_M and
Q5_K_M (llama-cpp-python's `llama_model_quantize`, its defaults: Q4_K or Q5_K, with Q6_K for the
head and some value and down projections), and saves in
`crates/trainer/tests/fixtures/gguf/k_quants/`:

- `q4_k_m.gguf`, `q5_k_m.gguf`: the files,
- `llamacpp.json`: for each, its SHA-256, each tensor's type, llama.cpp's token ids of a prompt
  (after BOS) and its logits `[tokens, vocab]` with an f32 KV cache.

Not for CI (llama-cpp-python compiles llama.cpp). From the repository root:

    python -m venv .llama && .llama/bin/pip install llama-cpp-python numpy gguf
    cargo build --release
    .llama/bin/python scripts/gguf-kquant-fixture.py --tinygpt target/release/tinygpt
"""

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from importlib import import_module  # noqa: E402

llamacpp_fixtures = import_module("gguf-llamacpp")

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/trainer/tests/fixtures/gguf/k_quants"
SETTINGS = ["model.n_layer=2", "model.n_head=4", "model.n_embd=256", "model.n_kv_head=2",
            'model.position="rope"', 'model.norm="rms"', 'model.mlp="swiglu"',
            "model.mlp_hidden=512", "model.bias=false", "model.tie_embeddings=false",
            "model.rope_theta=10000", "model.block_size=160", 'data.tokenizer="bpe"',
            "data.bpe_vocab_size=400", "train.batch_size=8", "train.learning_rate=3e-3",
            "train.warmup_iters=10", "train.eval_interval=200", "train.eval_iters=2",
            "train.sample_tokens=0", "train.seed=7"]
STEPS = 200
# llama.h's `LLAMA_FTYPE_MOSTLY_Q4_K_M` and `_Q5_K_M`.
FTYPES = {"q4_k_m": 15, "q5_k_m": 17}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tinygpt", required=True, help="the tinygpt binary")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = work / "corpus.txt"
        corpus.write_text((ROOT / "data/paradise-lost.txt").read_text(encoding="utf-8")[:40000],
                          encoding="utf-8")
        train = [args.tinygpt, "train", "--backend", "fused", "--data", str(corpus), "--out",
                 str(work / "run"), "--max-iters", str(STEPS)]
        for setting in SETTINGS:
            train += ["--set", setting]
        subprocess.run(train, check=True, stdout=subprocess.DEVNULL)
        f32 = work / "f32.gguf"
        subprocess.run([args.tinygpt, "export", "--checkpoint", str(work / "run"), "--format",
                        "gguf", "--out", str(f32)], check=True, stdout=subprocess.DEVNULL)
        OUT.mkdir(parents=True, exist_ok=True)
        for name, ftype in FTYPES.items():
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype, params.nthread = ftype, 2
            code = llama_cpp.llama_model_quantize(str(f32).encode(),
                                                  str(OUT / f"{name}.gguf").encode(), params)
            assert code == 0, f"llama_model_quantize: {code}"
    fixture = {}
    for name in FTYPES:
        model = OUT / f"{name}.gguf"
        types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(model)).tensors}
        out = llamacpp_fixtures.llama_cpp_outputs(model, None, steps=0)
        fixture[name] = {"gguf_sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
                         "types": types, "prompt": out["prompt"], "logits": out["logits"]}
        counts = {}
        for kind in types.values():
            counts[kind] = counts.get(kind, 0) + 1
        print(f"{name}: {model.stat().st_size} bytes, types {counts}, "
              f"{len(out['prompt'])} prompt tokens", file=sys.stderr)
    fixture["llama_cpp_python"] = llama_cpp.__version__
    (OUT / "llamacpp.json").write_text(json.dumps(fixture) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
