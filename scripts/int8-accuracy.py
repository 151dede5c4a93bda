#!/usr/bin/env python3
"""What int8 decoding (`--weights q8_0`) costs a trained run in accuracy: for five prompts, how
many of the first N greedy tokens (characters, for a char run) agree with f32's before the two
texts first differ; how many of f32's N next-token choices int8 makes too, each after the same
text (f32's continuation so far: one near-tie then counts once, not for the rest of the text);
and the validation loss with each (`eval --weights`). Not for CI (the run is yours; nothing is
downloaded):

    python3 scripts/int8-accuracy.py --tinygpt target/release/tinygpt --checkpoint runs/baby

With `--llamacpp` (a run llama.cpp can compute: GPT-2's parts or Llama's, see `tinygpt export
--help`; llama-cpp-python installed, which builds llama.cpp) the same greedy texts from llama.cpp
too, the run exported as GGUF F32 and Q8_0: how far llama.cpp's own Q8_0 agrees with its F32,
and tinygpt's with llama.cpp's in each format:

    python -m venv .llama && .llama/bin/pip install llama-cpp-python numpy
    .llama/bin/python scripts/int8-accuracy.py --tinygpt target/release/tinygpt \
        --checkpoint runs/llama-shaped --llamacpp
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPTS = ["\n", "ROMEO:\n", "First Citizen:\nWe are", "KING HENRY", "O, what a"]


def tinygpt(binary, *args):
    return subprocess.run([binary, *args], check=True, capture_output=True, text=True).stdout


def first_difference(a, b):
    """How many leading characters `a` and `b` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def llamacpp_texts(binary, run, block_size, tokens):
    """llama.cpp's greedy text (`tokens` characters) after each prompt, with the run exported as
    GGUF F32 and as Q8_0: `{"f32": [...], "q8_0": [...]}`."""
    import llama_cpp
    import numpy as np
    texts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in ["f32", "q8_0"]:
            gguf = Path(tmp) / f"run-{dtype}.gguf"
            tinygpt(binary, "export", *run[:4], "--format", "gguf", "--dtype", dtype,
                    "--out", str(gguf))
            # type_k/type_v 0: an f32 KV cache, as tinygpt keeps (llama.cpp's default is f16);
            # logits_all: without it `scores` does not hold each step's logits.
            llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=block_size, n_threads=2, seed=0,
                                  verbose=False, type_k=0, type_v=0, logits_all=True)
            texts[dtype] = []
            for prompt in PROMPTS:
                ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)
                assert len(ids) + tokens <= block_size, "prompt and text must fit the context"
                llm.reset()
                llm.eval(ids)
                out = []
                for _ in range(tokens):
                    out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
                    llm.eval([out[-1]])
                texts[dtype].append(llm.detokenize(out).decode(errors="replace")[:tokens])
            del llm
    return texts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tinygpt", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--which", choices=["best", "last"], default="best",
                        help="the run's weights to compare (a run stopped before its first "
                             "evaluation has only `last`)")
    parser.add_argument("--llamacpp", action="store_true",
                        help="llama.cpp's greedy texts beside tinygpt's, F32 and Q8_0")
    args = parser.parse_args()
    run = ["--checkpoint", args.checkpoint, "--which", args.which, "--backend", "fused"]
    agree, forced, greedy = [], [], []
    for prompt in PROMPTS:
        texts = {}
        for weights in ["f32", "q8_0"]:
            texts[weights] = tinygpt(
                args.tinygpt, "generate", *run, "--weights", weights, "--prompt", prompt,
                "--temperature", "0", "--max-new-tokens", str(args.tokens)
            )[len(prompt):][:args.tokens]
        a, b = texts["f32"], texts["q8_0"]
        same = first_difference(a, b)
        agree.append(same)
        greedy.append(texts)
        # Teacher-forced: both formats' next token after each prefix of f32's text (a char
        # run's tokens are its characters; for other tokenizers, a prefix cut inside a token
        # is tokenized as such by both).
        nexts = {w: [tinygpt(args.tinygpt, "generate", *run, "--weights", w, "--prompt",
                             prompt + a[:i], "--temperature", "0", "--max-new-tokens", "1")
                     [len(prompt) + i:] for i in range(len(a))] for w in ["f32", "q8_0"]}
        both = sum(x == y for x, y in zip(nexts["f32"], nexts["q8_0"]))
        forced.append(both / max(len(a), 1))
        print(json.dumps({"prompt": prompt, "same_first_chars": same, "of": len(a),
                          "same_next_token": both}), flush=True)
    if args.llamacpp:
        config = Path(args.checkpoint) / "config.toml"
        block = int(next(line.split("=")[1] for line in config.read_text().splitlines()
                         if line.startswith("block_size")))
        llama = llamacpp_texts(args.tinygpt, run, block, args.tokens)
        pairs = {
            "llamacpp_q8_0_vs_llamacpp_f32": [first_difference(x, y)
                                              for x, y in zip(llama["q8_0"], llama["f32"])],
            "tinygpt_f32_vs_llamacpp_f32": [first_difference(t["f32"], y)
                                            for t, y in zip(greedy, llama["f32"])],
            "tinygpt_q8_0_vs_llamacpp_q8_0": [first_difference(t["q8_0"], y)
                                              for t, y in zip(greedy, llama["q8_0"])],
        }
        for name, same in pairs.items():
            print(json.dumps({"same_first_chars": name, "per_prompt": same,
                              "mean": sum(same) / len(same)}), flush=True)
    losses = {}
    for weights in ["f32", "q8_0"]:
        line = tinygpt(args.tinygpt, "eval", *run, "--weights", weights)
        losses[weights] = float(next(p for p in line.split(" | ") if p.startswith("loss "))[5:])
    print(json.dumps({"agreeing_prefix_mean": sum(agree) / len(agree),
                      "next_token_agreement_percent": round(100 * sum(forced) / len(forced), 1),
                      "val_loss": losses,
                      "loss_change_percent": round(100 * (losses["q8_0"] / losses["f32"] - 1), 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
