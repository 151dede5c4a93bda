#!/usr/bin/env bash
# Runs on the GPU machine, from the folder scripts/gpu-pack.sh filled: tinygpt's training and
# sampling bench on the GPU through each backend (CUDA, and wgpu where the machine has Vulkan),
# the PyTorch reference GPT on the same GPU (eager float32, and nanoGPT's settings: bf16
# autocast + TF32 + torch.compile), then one table of ratios. One program at a time.
#
#   ./gpu-run.sh [iters] [backends]        # defaults: 50 iterations, "cuda cuda:bf16 wgpu"
#                                          # (BACKEND:DTYPE sets train.dtype)
#   KERNELS=1 ./gpu-run.sh                 # also `bench --kernels` at shakespeare-char's size
#   CONFIGS="shakespeare-char baby"        # the configs and their order (default: baby first)
#   FULL=1 ./gpu-run.sh                    # also the full 5000-step shakespeare-char run (on the
#                                          # first BACKEND[:DTYPE]; MAX_TIME=9m to split it, then RESUME=1)
#
# RESULTS: where the JSON lines go (default ./results.jsonl). PYTHON: a Python with torch.
set -uo pipefail
cd "$(dirname "$0")"
iters="${1:-50}"
backends="${2:-cuda cuda:bf16 wgpu}"
first_item="${backends%% *}"
first="${first_item%%:*}"
python="${PYTHON:-python3}"
results="${RESULTS:-results.jsonl}"
: > "$results"
[ -f tinygpt.xz ] && [ ! -x tinygpt ] && xz -dk tinygpt.xz && chmod +x tinygpt
[ -f tinygpt.gz ] && [ ! -x tinygpt ] && gunzip -k tinygpt.gz && chmod +x tinygpt
# The NVIDIA Vulkan driver's manifest, where the machine keeps it outside the loader's search path.
for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json; do
  [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
"$python" -c 'import torch; print("torch:", torch.__version__)'
# What the CUDA build loads at run time: the driver library, and libdevice from the toolkit.
ls /usr/lib/x86_64-linux-gnu/libcuda.so* /usr/local/cuda/nvvm/libdevice/libdevice.10.bc 2>&1 | sed 's/^/cuda: /'

# Every program has a time limit (STEP_TIMEOUT seconds, default 180), so one that hangs does not
# take the rest with it. The step-0 losses against the fused engine: gpu-first-light.sh.
limit() { timeout -k 5 "${STEP_TIMEOUT:-180}" "$@"; }
# BACKEND[:DTYPE] -> the bench's arguments.
bench_args() {
  local backend="${1%%:*}" dtype=""
  [ "$1" != "$backend" ] && dtype="${1#*:}"
  echo "--backend $backend${dtype:+ --set train.dtype=$dtype}"
}

model_args() {
  case "$1" in
    baby) echo "--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12" ;;
    shakespeare-char) echo "--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 64 --dropout 0.2 --no-bias" ;;
  esac
}
tag() { sed "s/^{/{\"who\": \"$1\", \"config\": \"$2\", /"; }

for config in ${CONFIGS:-baby shakespeare-char}; do
  echo "== $config"
  for backend in $backends; do
    # shellcheck disable=SC2046
    limit ./tinygpt bench --config "$config" $(bench_args "$backend") --iters "$iters" --warmup 10 \
      --sample-tokens 200 --json | tag "tinygpt-${backend/:/-}" "$config" | tee -a "$results"
  done
  # shellcheck disable=SC2046
  limit "$python" torch_gpt.py train --data tinyshakespeare.txt $(model_args "$config") --device cuda \
    --iters "$iters" --eval-iters 1 --sample-tokens 200 | tag "torch-f32" "$config" | tee -a "$results"
  # shellcheck disable=SC2046
  limit "$python" torch_gpt.py train --data tinyshakespeare.txt $(model_args "$config") --device cuda \
    --dtype bfloat16 --tf32 --compile --iters "$iters" --eval-iters 1 --sample-tokens 200 \
    | tag "torch-bf16-compile" "$config" | tee -a "$results"
done

if [ -n "${KERNELS:-}" ]; then
  echo "== kernels of a shakespeare-char step on $first, f32 and bf16"
  for dtype in f32 bf16; do
    limit ./tinygpt bench --config shakespeare-char --backend "$first" --set "train.dtype=$dtype" \
      --iters 3 --warmup 3 --sample-tokens 1 --kernels 2
  done
fi

if [ -n "${FULL:-}" ]; then
  echo "== shakespeare-char, 5000 steps on $first_item"
  run=/tmp/tinygpt-sc
  if [ -n "${RESUME:-}" ]; then
    resume=(--resume --out "$run")
  else
    rm -rf "$run"
    resume=(--config shakespeare-char --data tinyshakespeare.txt --out "$run")
  fi
  start=$(date +%s.%N)
  # shellcheck disable=SC2046
  ./tinygpt train "${resume[@]}" $(bench_args "$first_item") ${MAX_TIME:+--max-time "$MAX_TIME"} \
    | grep -E "^(training|resuming|step [0-9]+:|done|time limit)"
  end=$(date +%s.%N)
  ./tinygpt eval --checkpoint "$run" --backend "$first"
  echo "{\"who\": \"tinygpt-${first_item/:/-}\", \"config\": \"shakespeare-char\", \"phase\": \"full\", \"wall_s\": $(awk "BEGIN{print $end - $start}")}" | tee -a "$results"
fi

"$python" - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
def get(who, config, phase, key):
    for r in rows:
        if r.get("who") == who and r.get("config") == config and r.get("phase", "train") == phase and key in r:
            return r[key]
print()
print("| config | backend | tinygpt tok/s | torch f32 eager | ratio | torch bf16+compile | ratio | sampling tok/s tinygpt (KV cache) / torch (no cache) |")
print("|---|---|---|---|---|---|---|---|")
for c in ["baby", "shakespeare-char"]:
    for g in [r for r in rows if r.get("who", "").startswith("tinygpt") and r["config"] == c and "train_tokens_per_s" in r]:
        f = get("torch-f32", c, "train", "tokens_per_s")
        b = get("torch-bf16-compile", c, "train", "tokens_per_s")
        s = get("torch-f32", c, "sample", "tokens_per_s")
        ratio = lambda x: f"{g['train_tokens_per_s'] / x:.2f}x" if x else "-"
        print(f"| {c} | {g['who'][len('tinygpt-'):]} | {g['train_tokens_per_s']:.0f} | {f or '-'} | {ratio(f)} | {b or '-'} | {ratio(b)} | "
              f"{g.get('sample_tokens_per_s', 0):.0f} (first pass {g.get('first_sample_tokens_per_s', 0):.0f}) / {s or '-'} |")
PY
