#!/usr/bin/env bash
# Runs on the GPU machine, from the folder scripts/gpu-pack.sh filled: tinygpt's training and
# sampling bench on the GPU through each backend (CUDA, and wgpu where the machine has Vulkan),
# the PyTorch reference GPT on the same GPU (eager float32, and nanoGPT's settings: bf16
# autocast + TF32 + torch.compile), then one table of ratios. One program at a time.
#
#   ./gpu-run.sh [iters] [backends]        # defaults: 50 iterations, "cuda wgpu"
#   FULL=1 ./gpu-run.sh                    # also the full 5000-step shakespeare-char run (on the
#                                          # first backend; MAX_TIME=9m to split it, then RESUME=1)
#
# RESULTS: where the JSON lines go (default ./results.jsonl). PYTHON: a Python with torch.
set -uo pipefail
cd "$(dirname "$0")"
iters="${1:-50}"
backends="${2:-cuda wgpu}"
first="${backends%% *}"
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

# The step-0 loss on each backend against the fused CPU engine's, from the same seed.
for backend in fused $backends; do
  rm -rf "/tmp/tinygpt-step0-$backend"
  ./tinygpt train --config baby --data tinyshakespeare.txt --backend "$backend" --max-iters 0 \
    --set train.eval_iters=20 --out "/tmp/tinygpt-step0-$backend" 2>&1 | grep -E "^(step 0|tinygpt: error)" \
    | sed "s/^/step-0 $backend: /"
done

model_args() {
  case "$1" in
    baby) echo "--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12" ;;
    shakespeare-char) echo "--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 64 --dropout 0.2 --no-bias" ;;
  esac
}
tag() { sed "s/^{/{\"who\": \"$1\", \"config\": \"$2\", /"; }

for config in baby shakespeare-char; do
  echo "== $config"
  for backend in $backends; do
    ./tinygpt bench --config "$config" --backend "$backend" --iters "$iters" --warmup 10 \
      --sample-tokens 200 --json | tag "tinygpt-$backend" "$config" | tee -a "$results"
  done
  # shellcheck disable=SC2046
  "$python" torch_gpt.py train --data tinyshakespeare.txt $(model_args "$config") --device cuda \
    --iters "$iters" --eval-iters 1 --sample-tokens 200 | tag "torch-f32" "$config" | tee -a "$results"
  # shellcheck disable=SC2046
  "$python" torch_gpt.py train --data tinyshakespeare.txt $(model_args "$config") --device cuda \
    --dtype bfloat16 --tf32 --compile --iters "$iters" --eval-iters 1 --sample-tokens 200 \
    | tag "torch-bf16-compile" "$config" | tee -a "$results"
done

if [ -n "${FULL:-}" ]; then
  echo "== shakespeare-char, 5000 steps on $first"
  run=/tmp/tinygpt-sc
  if [ -n "${RESUME:-}" ]; then
    resume=(--resume --out "$run")
  else
    rm -rf "$run"
    resume=(--config shakespeare-char --data tinyshakespeare.txt --out "$run")
  fi
  start=$(date +%s.%N)
  ./tinygpt train "${resume[@]}" --backend "$first" ${MAX_TIME:+--max-time "$MAX_TIME"} \
    | grep -E "^(training|resuming|step [0-9]+:|done|time limit)"
  end=$(date +%s.%N)
  ./tinygpt eval --checkpoint "$run" --backend "$first"
  echo "{\"who\": \"tinygpt-$first\", \"config\": \"shakespeare-char\", \"phase\": \"full\", \"wall_s\": $(echo "$end - $start" | bc)}" | tee -a "$results"
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
        print(f"| {c} | {g['backend']} | {g['train_tokens_per_s']:.0f} | {f or '-'} | {ratio(f)} | {b or '-'} | {ratio(b)} | "
              f"{g.get('sample_tokens_per_s', 0):.0f} / {s or '-'} |")
PY
