#!/usr/bin/env python3
"""Makes a small Llama GGUF with a SentencePiece tokenizer (`tokenizer.ggml.model = "llama"`, as
TinyLlama's and Llama 2's files have) and saves what the real llama.cpp computes from it, for
`crates/trainer/tests/gguf_llamacpp.rs`, which imports the file with `tinygpt import` and
checks that tinygpt tokenizes, scores and continues as llama.cpp does.

The vocabulary is learned here by byte-pair merges over the first 20,000 characters of
`data/paradise-lost.txt` (SentencePiece's way: a space is `▁` and starts a piece), scored as
SentencePiece scores its BPE pieces (the earlier merge, the higher the score), with `<unk>`,
`<s>`, `</s>`, the 256 byte tokens `<0x00>`..`<0xFF>` for characters outside the vocabulary,
two control tokens and a user-defined one. The weights are random (seeded): the check is of the
tokenizer and of the import, not of a trained model.

Not for CI (llama-cpp-python compiles llama.cpp). From the repository root:

    python -m venv .llama && .llama/bin/pip install llama-cpp-python numpy gguf
    .llama/bin/python scripts/gguf-spm-fixture.py
"""

import collections
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import gguf
import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# What llama.cpp computes from a file, as the other GGUF fixtures record it.
_spec = importlib.util.spec_from_file_location("gguf_llamacpp",
                                               Path(__file__).with_name("gguf-llamacpp.py"))
gguf_llamacpp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gguf_llamacpp)
OUT = ROOT / "crates/trainer/tests/fixtures/gguf/spm"
MERGES = 200
# Characters the vocabulary leaves out, so that they go through the byte tokens.
OUTSIDE = set("日本語のテキスト。Ωω")
SPECIAL = [("<unk>", 2), ("<s>", 3), ("</s>", 3)]
AFTER = [("<|im_start|>", 3), ("<|im_end|>", 3), ("<|user|>", 4)]
TEXTS = [
    "Of Man's first disobedience, and the fruit",
    "naïve café über Straße — “λόγος” Ωμέγα 日本語のテキスト。",
    "  two  spaces,\ta tab\nand a newline ",
    "the end</s>And then<|user|>who<|im_start|>assistant\nHello<|im_end|>",
    "",
]
N_EMBD, N_HEAD, N_KV_HEAD, N_FF, CONTEXT = 32, 4, 2, 64, 128
GREEDY = 40


def learn(text: str) -> list[tuple[str, float]]:
    """Pieces and scores: the merges in order (score -rank), then the characters."""
    words = collections.Counter("▁" + w for w in text.replace("\n", " ").split(" ") if w)
    chars = sorted({c for w in words for c in w} - OUTSIDE)
    words = {tuple(w): n for w, n in words.items() if not set(w) & OUTSIDE}
    pieces = []
    for _ in range(MERGES):
        pairs = collections.Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[a, b] += n
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        pieces.append(a + b)
        merged = {}
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == (a, b):
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    scored = [(p, -float(i)) for i, p in enumerate(pieces)]
    return scored + [(c, -float(MERGES + i)) for i, c in enumerate(chars) if c not in pieces]


def write(path: Path) -> None:
    text = (ROOT / "data/paradise-lost.txt").read_text(encoding="utf-8")[:20000]
    text += " naïve café über Straße — “λόγος” μέγα"
    vocab = [(t, 0.0, kind) for t, kind in SPECIAL]
    vocab += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    vocab += [(p, s, 1) for p, s in learn(text)]
    vocab += [(t, 0.0, kind) for t, kind in AFTER]
    rng = np.random.default_rng(20261127)
    d_head = N_EMBD // N_HEAD
    shapes = {
        "token_embd.weight": (len(vocab), N_EMBD),
        "output_norm.weight": (N_EMBD,),
        "output.weight": (len(vocab), N_EMBD),
        "blk.0.attn_norm.weight": (N_EMBD,),
        "blk.0.attn_q.weight": (N_EMBD, N_EMBD),
        "blk.0.attn_k.weight": (N_KV_HEAD * d_head, N_EMBD),
        "blk.0.attn_v.weight": (N_KV_HEAD * d_head, N_EMBD),
        "blk.0.attn_output.weight": (N_EMBD, N_EMBD),
        "blk.0.ffn_norm.weight": (N_EMBD,),
        "blk.0.ffn_gate.weight": (N_FF, N_EMBD),
        "blk.0.ffn_up.weight": (N_FF, N_EMBD),
        "blk.0.ffn_down.weight": (N_EMBD, N_FF),
    }
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("spm-fixture")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(1)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV_HEAD)
    w.add_rope_dimension_count(d_head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list([t for t, _, _ in vocab])
    w.add_token_scores([s for _, s, _ in vocab])
    w.add_token_types([k for _, _, k in vocab])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    for name, shape in shapes.items():
        scale = 1.0 if len(shape) == 1 else 0.5
        values = rng.normal(1.0 if len(shape) == 1 else 0.0, scale if len(shape) > 1 else 0.1,
                            shape).astype(np.float32)
        w.add_tensor(name, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "model.gguf"
    write(path)
    out = gguf_llamacpp.llama_cpp_outputs(path, 2, TEXTS, GREEDY, CONTEXT)
    out = {"gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
           "llama_cpp_python": llama_cpp.__version__, "eos": 2, **out}
    (OUT / "llamacpp.json").write_text(json.dumps(out, ensure_ascii=False) + "\n")
    print(f"{len(out['prompt'])} prompt tokens, ids {[t['ids'] for t in out['texts']]}, "
          f"greedy {out['greedy']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
