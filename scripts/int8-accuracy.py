#!/usr/bin/env python3
"""What int8 decoding (`--weights q8_0`) costs a trained run in accuracy: for five prompts, how
many of the first N greedy tokens (characters, for a char run) agree with f32's before the two
texts first differ; how many of f32's N next-token choices int8 makes too, each after the same
text (f32's continuation so far: one near-tie then counts once, not for the rest of the text);
and the validation loss with each (`eval --weights`). Not for CI (the run is yours; nothing is
downloaded):

    python3 scripts/int8-accuracy.py --tinygpt target/release/tinygpt --checkpoint runs/baby
"""

import argparse
import json
import subprocess
import sys

PROMPTS = ["\n", "ROMEO:\n", "First Citizen:\nWe are", "KING HENRY", "O, what a"]


def tinygpt(binary, *args):
    return subprocess.run([binary, *args], check=True, capture_output=True, text=True).stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tinygpt", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--which", choices=["best", "last"], default="best",
                        help="the run's weights to compare (a run stopped before its first "
                             "evaluation has only `last`)")
    args = parser.parse_args()
    run = ["--checkpoint", args.checkpoint, "--which", args.which, "--backend", "fused"]
    agree, forced = [], []
    for prompt in PROMPTS:
        texts = {}
        for weights in ["f32", "q8_0"]:
            texts[weights] = tinygpt(
                args.tinygpt, "generate", *run, "--weights", weights, "--prompt", prompt,
                "--temperature", "0", "--max-new-tokens", str(args.tokens)
            )[len(prompt):][:args.tokens]
        a, b = texts["f32"], texts["q8_0"]
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        agree.append(same)
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
