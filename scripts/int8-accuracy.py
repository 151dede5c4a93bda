#!/usr/bin/env python3
"""What int8 decoding (`--weights q8_0`) costs a trained run in accuracy: for five prompts, how
many of the first N greedy tokens (characters, for a char run) agree with f32's before the two
texts first differ; and the validation loss with each (`eval --weights`). Not for CI (the run is
yours; nothing is downloaded):

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
    args = parser.parse_args()
    agree = []
    for prompt in PROMPTS:
        texts = {}
        for weights in ["f32", "q8_0"]:
            texts[weights] = tinygpt(
                args.tinygpt, "generate", "--checkpoint", args.checkpoint, "--backend", "fused",
                "--weights", weights, "--prompt", prompt, "--temperature", "0",
                "--max-new-tokens", str(args.tokens))[len(prompt):][:args.tokens]
        a, b = texts["f32"], texts["q8_0"]
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        agree.append(same)
        print(json.dumps({"prompt": prompt, "same_first_chars": same, "of": len(a)}), flush=True)
    losses = {}
    for weights in ["f32", "q8_0"]:
        line = tinygpt(args.tinygpt, "eval", "--checkpoint", args.checkpoint, "--backend",
                       "fused", "--weights", weights)
        losses[weights] = float(next(p for p in line.split(" | ") if p.startswith("loss "))[5:])
    print(json.dumps({"agreeing_prefix_mean": sum(agree) / len(agree), "val_loss": losses,
                      "loss_change_percent": round(100 * (losses["q8_0"] / losses["f32"] - 1), 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
