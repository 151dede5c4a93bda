#!/usr/bin/env bash
# Packs a GPU measurement into one git-ignored folder that can travel to a GPU machine without a
# Rust toolchain: the stripped release binary built with CUDA (`--features cuda`; the LLVM it
# links comes from scripts/llvm-for-cuda.sh), scripts/gpu-run.sh, the tiny-shakespeare corpus and
# the PyTorch reference GPT, the load generator `serve_load`, and (RUN) a trained run to sample
# from. Then run `gpu-bench/gpu-run.sh` or `gpu-bench/gpu-sample.sh` on the GPU machine.
#
#   scripts/gpu-pack.sh            # -> gpu-bench/ (under 64 MiB: the binary is compressed)
#
# CORPUS: tiny shakespeare (default ../shared/data/tinyshakespeare.txt; nanoGPT's
#   data/shakespeare_char/input.txt is the same file).
# TORCH_GPT: the PyTorch reference GPT (default ../shared/bench/torch_gpt.py).
# OUT_DIR: the folder to fill (default gpu-bench, ignored by git).
# FEATURES: cargo features of the binary (default cuda; empty for wgpu only, without LLVM).
# RUN: a run directory to copy as baby-run/ (its best weights; gpu-sample.sh needs one).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT_DIR:-gpu-bench}"
corpus="${CORPUS:-../shared/data/tinyshakespeare.txt}"
torch_gpt="${TORCH_GPT:-../shared/bench/torch_gpt.py}"
features="${FEATURES-cuda}"
[ -f "$corpus" ] || { echo "error: no tiny shakespeare: set CORPUS=path/to/input.txt" >&2; exit 1; }
[ -f "$torch_gpt" ] || { echo "error: no PyTorch reference GPT: set TORCH_GPT=path/to/torch_gpt.py" >&2; exit 1; }
case " $features " in *" cuda "*) scripts/llvm-for-cuda.sh ;; esac
cargo build --release -q -p tinygpt --bin tinygpt --example serve_load ${features:+--features "$features"}
target="${CARGO_TARGET_DIR:-target}"
rm -rf "$out"
mkdir -p "$out"
cp "$target/release/tinygpt" "$target/release/examples/serve_load" "$out/"
strip "$out/tinygpt" "$out/serve_load"
# LLVM is linked in statically: xz packs the binary to about a fifth; the scripts unpack it.
xz -9 -T0 "$out/tinygpt" "$out/serve_load"
cp scripts/gpu-run.sh scripts/gpu-first-light.sh scripts/gpu-sample.sh scripts/gpu-serve.sh scripts/gpu-full-run.sh \
  scripts/gpu-train-check.sh \
  scripts/serve-check.py scripts/torch-sample.py "$out/"
if [ -n "${RUN:-}" ]; then
  mkdir -p "$out/baby-run"
  for part in best config.toml tokenizer.json data; do
    [ -e "$RUN/$part" ] && cp -r "$RUN/$part" "$out/baby-run/"
  done
fi
cp "$corpus" "$out/tinyshakespeare.txt"
cp "$torch_gpt" "$out/torch_gpt.py"
du -sh "$out" "$out/tinygpt.xz"
