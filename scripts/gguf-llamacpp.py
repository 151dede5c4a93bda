#!/usr/bin/env python3
"""Checks tinygpt's GGUF export against the real llama.cpp, and saves what llama.cpp computed
as the fixtures `crates/trainer/tests/gguf_llamacpp.rs` compares tinygpt with in CI.

For six small runs (a char-vocabulary GPT-2, a byte-level BPE GPT-2 with biases, the `baby`
preset's parts with their exact GELU, a Llama-shaped BPE model with grouped-query attention and
an untied head, one with the `modern` preset's QK-norm, written as llama.cpp's `qwen3`, and one
with its ReLU², written as `arcee`), each kept in
`crates/trainer/tests/fixtures/gguf/NAME/` (trained here once, with `--retrain` again), it:

1. exports the run with `tinygpt export --format gguf` (f32) and notes the file's SHA-256,
2. loads that file in llama.cpp (through llama-cpp-python, which builds it) with an f32 KV cache,
3. saves llama.cpp's token ids for texts with non-ASCII characters and special tokens, the
   logits `[tokens, vocab]` of the first text, and its greedy continuation of 100 tokens,
   in `NAME/llamacpp.json`.

Not for CI (llama-cpp-python compiles llama.cpp). Run it from the repository root:

    python -m venv .llama && .llama/bin/pip install llama-cpp-python numpy
    cargo build --release
    .llama/bin/python scripts/gguf-llamacpp.py --tinygpt target/release/tinygpt
"""

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates/trainer/tests/fixtures/gguf"
# Characters the char run must know: they are in its corpus.
EXTRA = "\nÉvangile, naïve café — “quoted” über Straße; λόγος, Ωμέγα! 日本語のテキスト。\n"
TEXTS = [
    "Of Man's first disobedience, and the fruit",
    "naïve café über Straße — “λόγος” 日本語",
    "the end<|endoftext|>And then",
]
COMMON = [
    "model.block_size=160", "train.batch_size=8", "train.eval_interval=300",
    "train.eval_iters=2", "train.sample_tokens=0", "train.learning_rate=1e-2",
    "train.warmup_iters=20", "train.seed=7",
]
CASES = {
    # llama.cpp's gpt2 computes GELU with tanh's approximation only.
    "char": ["model.n_layer=2", "model.n_head=2", "model.n_embd=48", 'model.mlp="gelu_tanh"'],
    "bpe": ["model.n_layer=2", "model.n_head=2", "model.n_embd=48", 'model.mlp="gelu_tanh"',
            "model.bias=true", 'data.tokenizer="bpe"', "data.bpe_vocab_size=400"],
    "llama": ["model.n_layer=2", "model.n_head=4", "model.n_embd=64", 'model.position="rope"',
              'model.norm="rms"', 'model.mlp="swiglu"', "model.n_kv_head=2", "model.bias=false",
              "model.tie_embeddings=false", "model.rope_theta=5000", 'data.tokenizer="bpe"',
              "data.bpe_vocab_size=400"],
    # The baby preset's parts (nanoGPT's: exact GELU, biases, tied head, char vocabulary), two
    # layers: llama.cpp's gpt2 computes its GELU with tanh's approximation, which the export
    # measures on the run's validation text (kept with the run, in data/).
    "baby": ["model.n_layer=2", "model.n_head=2", "model.n_embd=48"],
    # The modern preset's ReLU² and gain-less RMSNorm, without its QK-norm and soft-cap: arcee.
    "arcee": ["model.n_layer=2", "model.n_head=4", "model.n_embd=64", 'model.position="rope"',
              'model.norm="rms_unit"', 'model.mlp="relu2"', "model.n_kv_head=2",
              "model.bias=false", "model.tie_embeddings=false", 'model.proj_init="zero"',
              'data.tokenizer="bpe"', "data.bpe_vocab_size=400"],
    # The modern preset's QK-norm and gain-less RMSNorm, with SwiGLU and no soft-cap: qwen3.
    "qwen3": ["model.n_layer=2", "model.n_head=4", "model.n_embd=64", 'model.position="rope"',
              'model.norm="rms_unit"', "model.qk_norm=true", 'model.mlp="swiglu"',
              "model.n_kv_head=2", "model.bias=false", "model.tie_embeddings=false",
              'model.proj_init="zero"', 'data.tokenizer="bpe"', "data.bpe_vocab_size=400"],
}
# Runs trained from a preset (the others from the default config), and runs kept with their
# prepared corpus (for the export's measured difference).
PRESETS = {"baby": "baby"}
KEEP_DATA = {"baby"}
STEPS = 300
GREEDY = 100


def train(tinygpt: str, name: str, work: Path) -> None:
    """Trains the run `name` on the corpus and keeps what a run needs to be read."""
    corpus = work / "corpus.txt"
    text = (ROOT / "data/paradise-lost.txt").read_text(encoding="utf-8")[:20000] + EXTRA
    corpus.write_text(text, encoding="utf-8")
    args = [tinygpt, "train", "--backend", "fused", "--data", str(corpus), "--out",
            str(work / name), "--max-iters", str(STEPS)]
    if name in PRESETS:
        args += ["--config", PRESETS[name]]
    for setting in COMMON + CASES[name]:
        args += ["--set", setting]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    keep = FIXTURES / name
    if keep.exists():
        shutil.rmtree(keep)
    (keep / "best").mkdir(parents=True)
    for file in ["config.toml", "tokenizer.json", "best/model.safetensors", "best/state.json"]:
        shutil.copy(work / name / file, keep / file)
    if name in KEEP_DATA:
        shutil.copytree(work / name / "data", keep / "data")


def llama_cpp_outputs(gguf: Path, eos: int | None, texts: list[str] = TEXTS,
                      steps: int = GREEDY, context: int = 160) -> dict:
    """llama.cpp's ids of `texts` (special tokens parsed, no BOS), the logits of the first as
    llama.cpp starts a prompt (after BOS where the file's `add_bos_token` says so) and its
    greedy continuation of `steps` tokens (or up to `eos`), within `context` positions."""
    # type_k/type_v 0 = GGML_TYPE_F32: llama.cpp's default f16 KV cache rounds keys and values.
    llm = llama_cpp.Llama(model_path=str(gguf), logits_all=True, n_ctx=256, n_threads=2,
                          seed=0, verbose=False, type_k=0, type_v=0)
    texts = [{"text": t, "ids": llm.tokenize(t.encode(), add_bos=False, special=True)}
             for t in texts]
    prompt = llm.tokenize(texts[0]["text"].encode(), add_bos=True, special=True)
    # Within the context, where tinygpt's generate computes what llama.cpp does (past it,
    # tinygpt slides its window and llama.cpp stops).
    assert len(prompt) + steps <= context, len(prompt)
    llm.reset()
    llm.eval(prompt)
    logits = np.asarray(llm.scores[: len(prompt)], dtype=np.float32)
    greedy = []
    for _ in range(steps):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        greedy.append(token)
        if token == eos:
            break
        llm.eval([token])
    # Nine significant digits hold an f32 exactly.
    rows = [[float(f"{v:.9g}") for v in row] for row in logits]
    return {"texts": texts, "prompt": prompt, "logits": rows, "greedy": greedy}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tinygpt", required=True, help="the tinygpt binary")
    parser.add_argument("--retrain", action="store_true", help="train the runs again")
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    args = parser.parse_args()
    for name in args.only or CASES:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            if args.retrain or not (FIXTURES / name / "best").exists():
                train(args.tinygpt, name, work)
            gguf = work / f"{name}.gguf"
            subprocess.run([args.tinygpt, "export", "--checkpoint", str(FIXTURES / name),
                            "--format", "gguf", "--out", str(gguf)], check=True,
                           stdout=subprocess.DEVNULL)
            eos = eos_id(gguf)
            out = llama_cpp_outputs(gguf, eos)
            out = {"gguf_sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
                   "llama_cpp_python": llama_cpp.__version__, "eos": eos, **out}
            (FIXTURES / name / "llamacpp.json").write_text(json.dumps(out) + "\n")
            print(f"{name}: {len(out['prompt'])} prompt tokens, {len(out['greedy'])} greedy, "
                  f"ids {[t['ids'] for t in out['texts']]}", file=sys.stderr)
    return 0


def eos_id(gguf: Path) -> int | None:
    from gguf import GGUFReader
    field = GGUFReader(gguf).fields.get("tokenizer.ggml.eos_token_id")
    return None if field is None else int(field.parts[field.data[0]][0])


if __name__ == "__main__":
    sys.exit(main())
