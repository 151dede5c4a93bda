#!/usr/bin/env bash
# Packs a GPU measurement into one git-ignored folder that can travel to a GPU machine without a
# Rust toolchain: the stripped release binary, scripts/gpu-run.sh, the tiny-shakespeare corpus and
# the PyTorch reference GPT. Then run `gpu-bench/gpu-run.sh` on the GPU machine.
#
#   scripts/gpu-pack.sh            # -> gpu-bench/ (about 30 MiB)
#
# CORPUS: tiny shakespeare (default ../shared/data/tinyshakespeare.txt; nanoGPT's
#   data/shakespeare_char/input.txt is the same file).
# TORCH_GPT: the PyTorch reference GPT (default ../shared/bench/torch_gpt.py).
# OUT_DIR: the folder to fill (default gpu-bench, ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT_DIR:-gpu-bench}"
corpus="${CORPUS:-../shared/data/tinyshakespeare.txt}"
torch_gpt="${TORCH_GPT:-../shared/bench/torch_gpt.py}"
[ -f "$corpus" ] || { echo "error: no tiny shakespeare: set CORPUS=path/to/input.txt" >&2; exit 1; }
[ -f "$torch_gpt" ] || { echo "error: no PyTorch reference GPT: set TORCH_GPT=path/to/torch_gpt.py" >&2; exit 1; }
cargo build --release -q -p tinygpt
target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$out"
cp "$target/release/tinygpt" "$out/tinygpt"
strip "$out/tinygpt"
# Compressed, it travels in a third of the size; gpu-run.sh unpacks it.
gzip -f -9 "$out/tinygpt"
cp scripts/gpu-run.sh "$out/gpu-run.sh"
cp "$corpus" "$out/tinyshakespeare.txt"
cp "$torch_gpt" "$out/torch_gpt.py"
du -sh "$out"
