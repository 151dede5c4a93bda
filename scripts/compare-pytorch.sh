#!/usr/bin/env bash
# tinygpt vs PyTorch on the same machine, one after the other (never at once: on a small machine
# contention distorts both far more than the differences being measured).
#
#   scripts/compare-pytorch.sh [baby|shakespeare-char] [iters]
#
# Runs torch_gpt.py train (the reference GPT of the same architecture), then `tinygpt bench`
# with the same config, and prints both and the ratio of training tokens/s.
# PYTHON: a Python with torch (default: ~/.venvs/torch/bin/python, else python3).
# TINYGPT: the binary (default: target/release/tinygpt, built if missing).
# BACKEND: the tinygpt backend (default: fused, the fastest on a CPU; wgpu with DEVICE=cuda).
# DEVICE=cuda: the GPU mode; PyTorch on CUDA, tinygpt on wgpu. TORCH_FLAGS adds flags to
#   torch_gpt.py, e.g. TORCH_FLAGS="--dtype bfloat16 --tf32 --compile" (nanoGPT's GPU settings).
# TORCH_GPT, CORPUS: torch_gpt.py and tiny shakespeare (defaults: the development checkout's).
set -euo pipefail
cd "$(dirname "$0")/.."

config="${1:-baby}"
case "$config" in
  baby) iters="${2:-200}"; model=(--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12) ;;
  shakespeare-char) iters="${2:-5}"; model=(--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 64 --dropout 0.2 --no-bias) ;;
  *) echo "usage: $0 [baby|shakespeare-char] [iters]" >&2; exit 2 ;;
esac
python="${PYTHON:-$HOME/.venvs/torch/bin/python}"
[ -x "$python" ] || python=python3
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "error: $python has no torch (python3 -m venv ~/.venvs/torch && ~/.venvs/torch/bin/pip install torch numpy safetensors)" >&2
  exit 1
fi
tinygpt="${TINYGPT:-${CARGO_TARGET_DIR:-target}/release/tinygpt}"
[ -x "$tinygpt" ] || cargo build --release -q -p tinygpt
device="${DEVICE:-cpu}"
if [ "$device" = cpu ]; then backend="${BACKEND:-fused}"; else backend="${BACKEND:-wgpu}"; fi
data="${CORPUS:-../shared/data/tinyshakespeare.txt}"
torch_gpt="${TORCH_GPT:-../shared/bench/torch_gpt.py}"
# shellcheck disable=SC2206
torch_flags=(--device "$device" ${TORCH_FLAGS:-})

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); config $config, $iters iterations; torch ${torch_flags[*]}, tinygpt $backend"
torch_out=$("$python" "$torch_gpt" train --data "$data" "${model[@]}" "${torch_flags[@]}" \
  --iters "$iters" --eval-iters 1 --sample-tokens 200)
torch_json=$(printf '%s\n' "$torch_out" | sed -n 1p)
printf 'pytorch: %s\n' "$torch_out"
tiny_json=$("$tinygpt" bench --config "$config" --backend "$backend" --iters "$iters" --warmup 3 --sample-tokens 200 --json)
echo "tinygpt: $tiny_json"
python3 - "$torch_json" "$tiny_json" <<'PY'
import json, sys
t, g = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"training tokens/s: tinygpt {g['train_tokens_per_s']:.0f} / pytorch {t['tokens_per_s']:.0f} "
      f"= {g['train_tokens_per_s'] / t['tokens_per_s']:.2f}x  "
      f"(ms/iter {g['ms_per_iter']:.1f} vs {t['ms_per_iter']:.1f})")
PY
