#!/usr/bin/env python3
"""Greedy completions from a running `tinygpt serve`, all requests at once, each checked against
`tinygpt generate` of the same prompt alone on another backend (by default the fused CPU decoder):
a server that batches its streams must give each the text it gets alone.

    python3 scripts/serve-check.py --url http://127.0.0.1:8199 --tinygpt ./tinygpt \
        --checkpoint runs/baby --max-tokens 120

Prints one line per prompt ("same" or "DIFFERS" with both texts) and exits 1 if any differs.
Standard library only.
"""
import argparse
import json
import subprocess
import sys
import threading
import urllib.request

PROMPTS = [
    "ROMEO:",
    "JULIET:\n",
    "First Citizen:",
    "KING",
    "O",
    "What say you",
    "\n",
    "MENENIUS:\nAnd",
]


def complete(url, prompt, max_tokens, out, i):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    request = urllib.request.Request(
        url + "/v1/completions", body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            out[i] = json.load(response)["choices"][0]["text"]
    except Exception as e:  # reported as a difference below
        out[i] = f"<request failed: {e}>"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--tinygpt", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--max-tokens", type=int, default=120)
    p.add_argument("--backend", default="fused", help="where `generate` runs alone")
    a = p.parse_args()
    got = [None] * len(PROMPTS)
    threads = [
        threading.Thread(target=complete, args=(a.url, prompt, a.max_tokens, got, i))
        for i, prompt in enumerate(PROMPTS)
    ]
    for t in threads:
        t.start()
    differ = 0
    for i, prompt in enumerate(PROMPTS):
        alone = subprocess.run(
            [a.tinygpt, "generate", "--checkpoint", a.checkpoint, "--backend", a.backend,
             "--prompt", prompt, "--max-new-tokens", str(a.max_tokens), "--temperature", "0"],
            capture_output=True, text=True,
        )
        threads[i].join()
        want = alone.stdout[len(prompt):].rstrip("\n")
        same = got[i] is not None and got[i].rstrip("\n") == want
        differ += not same
        print(f"{prompt!r}: {'same' if same else 'DIFFERS'}")
        if not same:
            print(f"  served: {got[i]!r}\n  alone:  {want!r}")
    print(f"{len(PROMPTS) - differ} of {len(PROMPTS)} served completions are the alone text")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
