#!/usr/bin/env bash
# Runs on the GPU machine, from the folder scripts/gpu-pack.sh filled: does training on CUDA
# learn, and how long does it wait before its first steps? Short shakespeare-char runs (nanoGPT's
# size and hyper-parameters, from the same seed), every step logged with its loss and gradient
# norm, each line stamped with the seconds since its process started:
#
# reference  the fused CPU engine, f32, the first STEPS_CPU steps (what the GPU runs should give)
# runs       on CUDA: the classic parts and the `modern` preset's parts, each in f32 and bf16
# parts      (when a modern run fails to learn) the modern parts one at a time on the classic
#            model, in the failing dtype: which part it is
#
#   ./gpu-train-check.sh                      # about six minutes on a fresh H100
#   STEPS=60 DTYPES="bf16" PARTS=0 ./gpu-train-check.sh
#   BACKEND=wgpu STEPS=3 STEPS_CPU=2 BATCH=2 ./gpu-train-check.sh     # the script itself, anywhere
#
# A run "learns" when its loss at the last step is below 3.3 (nanoGPT's model is near 2.5 by step
# 60 from 4.2; a diverging run climbs past 5). Every run has a time limit (LIMIT seconds, default
# 150). Summary lines go to $RESULTS (default ./train-check.jsonl), the logs beside it.
set -uo pipefail
cd "$(dirname "$0")"
results="${RESULTS:-train-check.jsonl}"
logs="$(dirname "$results")"
backend="${BACKEND:-cuda}"
steps="${STEPS:-60}"
steps_cpu="${STEPS_CPU:-5}"
dtypes="${DTYPES:-f32 bf16}"
limit="${LIMIT:-150}"
batch="${BATCH:-64}"
[ -f tinygpt.xz ] && [ ! -x tinygpt ] && xz -dk -T0 tinygpt.xz && chmod +x tinygpt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
modern=(--set model.position=rope --set model.norm=rms_unit --set model.qk_norm=true
  --set model.mlp=relu2 --set model.logit_softcap=15 --set model.proj_init=zero
  --set model.tie_embeddings=false)

# Each line read, stamped with the seconds since the first (bash's clock: awk may read a pipe
# in blocks and stamp late).
stamp() {
  local t0=${EPOCHREALTIME/./} line now
  while IFS= read -r line; do
    now=${EPOCHREALTIME/./}
    printf '[%6.1f s] %s\n' "$(((now - t0) / 100000))e-1" "$line"
  done
}

# run NAME BACKEND DTYPE STEPS [--set ...]: a short run; its steps (loss, gradient norm, seconds
# since start) and one summary line.
run() {
  local name=$1 on=$2 dtype=$3 n=$4
  shift 4
  rm -rf "check-$name"
  echo "== $name: $on, $dtype, $n steps"
  timeout -k 5 "$limit" ./tinygpt train --config shakespeare-char --data tinyshakespeare.txt \
    --out "check-$name" --backend "$on" --set train.dtype="$dtype" --max-iters "$n" \
    --set train.log_interval=1 --set train.eval_interval=100000 --set train.eval_iters=1 \
    --set train.batch_size="$batch" "$@" 2>&1 | stamp >"$logs/check-$name.log"
  local code=${PIPESTATUS[0]}
  grep -E "^\[ *[0-9.]+ s\] (step [0-9]+:|tinygpt: error)" "$logs/check-$name.log" | head -3
  local csv="check-$name/steps.csv"
  if [ -f "$csv" ]; then
    # step,loss,lr,grad_norm,tokens_per_s,skipped_steps,elapsed_s
    awk -F, 'NR > 1 && ($1 <= 3 || $1 % 10 == 0) { printf "  step %4d  loss %8.4f  grad norm %9.4f  %7.1f s\n", $1, $2, $4, $7 }' "$csv"
    local last first_s
    last=$(tail -1 "$csv" | cut -d, -f2)
    first_s=$(awk -F, 'NR == 2 { print $7 }' "$csv")
    echo "{\"who\": \"$name\", \"backend\": \"$on\", \"dtype\": \"$dtype\", \"steps\": $n, \"exit\": $code, \"last_loss\": ${last:-null}, \"first_step_s\": ${first_s:-null}, \"learns\": $(awk -v l="${last:-99}" 'BEGIN { print (l < 3.3) ? "true" : "false" }')}" | tee -a "$results"
  else
    tail -3 "$logs/check-$name.log"
    echo "{\"who\": \"$name\", \"backend\": \"$on\", \"dtype\": \"$dtype\", \"steps\": $n, \"exit\": $code, \"last_loss\": null}" | tee -a "$results"
  fi
}

run classic-fused-f32 fused f32 "$steps_cpu"
run modern-fused-f32 fused f32 "$steps_cpu" "${modern[@]}"
failing=""
for dtype in $dtypes; do
  run "classic-$backend-$dtype" "$backend" "$dtype" "$steps"
  run "modern-$backend-$dtype" "$backend" "$dtype" "$steps" "${modern[@]}"
  tail -1 "$results" | grep -q '"learns": true' || failing="${failing:-$dtype}"
done

if [ "${PARTS:-1}" = 1 ] && [ -n "$failing" ]; then
  echo "== the modern parts one at a time, $failing (the modern run did not learn)"
  for part in model.position=rope model.norm=rms_unit model.qk_norm=true model.mlp=relu2 \
    model.logit_softcap=15 model.proj_init=zero model.tie_embeddings=false; do
    run "part-${part%%=*}-$failing" "$backend" "$failing" "$steps" --set "$part"
  done
fi
