#!/usr/bin/env python3
"""llama.cpp's own quantiser on a committed model, for `tests/gguf_kquants.rs`: the bytes that
`tinygpt export --dtype q4_k|q4_k_m|q5_k_m|q6_k|q4_0 [--pure]` must write.

It trains a small Llama-shaped run 256 wide (two layers, grouped-query attention, SwiGLU 288
wide so that the down projections' rows are not whole super-blocks and take llama.cpp's
fallback types, an untied head) and exports it with tinygpt as Q8_0 (byte-equal to
llama.cpp's own Q8_0; half the size of f16), saved as
`crates/trainer/tests/fixtures/gguf/k_quants/quantisers/source.gguf`. llama.cpp's quantiser
(llama-cpp-python's `llama_model_quantize`, no importance matrix: ggml's reference quantisers;
`allow_requantize`, so it starts from the file's values as tinygpt's import reads them) then
writes it as pure Q4_K, Q4_K_M, Q5_K_M (as chosen and pure), Q6_K and Q4_0 (whose head it
keeps in Q6_K at this width), and `quantised.json` beside it records each tensor's type and the
SHA-256 of its data under the arguments tinygpt's export takes for the same file. tinygpt
imports `source.gguf`, exports it with each, and the script prints the tensors whose bytes
differ (none, when tinygpt writes what llama.cpp writes). An existing `source.gguf` is kept
(remove it to train the model again: training's rounding differs between CPUs, and every
fixture byte with it).

Not for CI (llama-cpp-python compiles llama.cpp). From the repository root:

    python -m venv .llama && .llama/bin/pip install llama-cpp-python numpy gguf
    cargo build --release
    .llama/bin/python scripts/gguf-kquant-quantisers-fixture.py --tinygpt target/release/tinygpt
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

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/trainer/tests/fixtures/gguf/k_quants/quantisers"
SETTINGS = ["model.n_layer=2", "model.n_head=2", "model.n_embd=256", "model.n_kv_head=1",
            'model.position="rope"', 'model.norm="rms"', 'model.mlp="swiglu"',
            "model.mlp_hidden=288", "model.bias=false", "model.tie_embeddings=false",
            "model.rope_theta=10000", "model.block_size=64", 'data.tokenizer="char"',
            "train.batch_size=4", "train.learning_rate=3e-3", "train.warmup_iters=5",
            "train.eval_interval=100", "train.eval_iters=1", "train.sample_tokens=0",
            "train.seed=11"]
STEPS = 40
# tinygpt's export arguments, llama.h's `llama_ftype` of the same file, and whether llama.cpp
# is asked for every matrix in the type (`pure`) or for its own choice per tensor.
DTYPES = {"q4_k": (15, True), "q4_k_m": (15, False), "q5_k_m": (17, False), "q6_k": (18, False),
          "q5_k_m --pure": (17, True), "q4_0": (2, False)}


def tensors(path):
    """Each tensor's ggml type name and the SHA-256 of its data."""
    reader = gguf.GGUFReader(str(path))
    return {t.name: {"type": t.tensor_type.name, "sha256": hashlib.sha256(
        t.data.tobytes()).hexdigest()} for t in reader.tensors}


def run(*args):
    subprocess.run([str(a) for a in args], check=True, stdout=subprocess.DEVNULL)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tinygpt", required=True)
    args = parser.parse_args()
    fixture, differ = {}, 0
    OUT.mkdir(parents=True, exist_ok=True)
    source = OUT / "source.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = work / "corpus.txt"
        corpus.write_text((ROOT / "data/paradise-lost.txt").read_text(encoding="utf-8")[:20000],
                          encoding="utf-8")
        train = [args.tinygpt, "train", "--backend", "fused", "--data", corpus, "--out",
                 work / "trained", "--max-iters", STEPS]
        for setting in SETTINGS:
            train += ["--set", setting]
        if source.exists():
            print(f"kept {source}")
        else:
            run(*train)
            run(args.tinygpt, "export", "--checkpoint", work / "trained", "--format", "gguf",
                "--dtype", "q8_0", "--out", source)
        run(args.tinygpt, "import", "--from", source, "--out", work / "imported")
        for n, (dtype, (ftype, pure)) in enumerate(DTYPES.items()):
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype, params.nthread = ftype, 2
            params.pure, params.allow_requantize = pure, True
            theirs_path = work / f"{n}.gguf"
            code = llama_cpp.llama_model_quantize(str(source).encode(),
                                                  str(theirs_path).encode(), params)
            assert code == 0, f"llama_model_quantize: {code}"
            theirs = tensors(theirs_path)
            fixture[dtype] = theirs
            ours_path = work / f"tinygpt-{n}.gguf"
            run(args.tinygpt, "export", "--checkpoint", work / "imported", "--format", "gguf",
                "--dtype", *dtype.split(), "--out", ours_path)
            ours = tensors(ours_path)
            types = {}
            for t in theirs.values():
                types[t["type"]] = types.get(t["type"], 0) + 1
            same = [n for n in theirs if ours.get(n) == theirs[n]]
            print(f"{dtype}: llama.cpp's types {types}; {len(same)} of {len(theirs)} tensors "
                  f"byte-equal in tinygpt's export")
            for name in theirs:
                if ours.get(name) != theirs[name]:
                    differ += 1
                    print(f"  {name}: llama.cpp {theirs[name]['type']}, tinygpt "
                          f"{ours.get(name, {}).get('type')}")
    (OUT / "quantised.json").write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
