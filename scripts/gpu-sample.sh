#!/usr/bin/env bash
# Runs on the GPU machine, from the folder scripts/gpu-pack.sh filled (with a trained baby run
# in baby-run/: RUN=… scripts/gpu-pack.sh): what sampling costs on CUDA, and the commands that
# never ran there. Every step has a time limit and prints its exit status; a failed step does
# not stop the others. JSON lines go to $RESULTS (default ./sample.jsonl).
#
#   ./gpu-sample.sh                 # all of it, in this order (about seven minutes on an H100):
#   PHASES="start bench torch eval serve kernels" ./gpu-sample.sh
#   TORCH_MORE=1                    # also PyTorch's baby compiled, and bf16 (tinygpt samples in f32)
#
# start   process start to first token, cold kernel cache then warm (`generate`, greedy), and
#         the 200 greedy tokens on cuda, each way of feeding a token (TINYGPT_DECODE_STEP = 0,
#         step, capture), against the fused CPU decoder's
# eval    `eval` of the run on cuda and on fused
# bench   `tinygpt bench --iters 0` (sampling only): tokens/s, and per token the launches,
#         host reads and kernels compiled after warm-up; baby and shakespeare-char sizes, each
#         way of feeding a token
# torch   torch-sample.py: PyTorch with a static KV cache, eager and torch.compile'd
# serve   `serve` on cuda: one completion, then 32 streams at once (serve_load)
# kernels `bench --kernels` of the shakespeare-char training step, f32 and bf16
set -uo pipefail
cd "$(dirname "$0")"
results="${RESULTS:-sample.jsonl}"
phases="${PHASES:-start bench torch eval serve kernels}"
python="${PYTHON:-python3}"
for packed in tinygpt serve_load; do
  [ -f "$packed.xz" ] && [ ! -x "$packed" ] && xz -dk "$packed.xz" && chmod +x "$packed"
done
run=baby-run
data=tinyshakespeare.txt
step() {
  local limit=$1
  shift
  echo "-- $*"
  timeout -k 5 "$limit" "$@" 2>&1
  echo "[exit $?]"
}
tag() { sed "s/^{/{\"who\": \"$1\", /" | tee -a "$results"; }
has() { case " $phases " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
"$python" -c 'import torch; print("torch:", torch.__version__)'

# Seconds from a process's start to its first byte of output, and to its end.
cat >/tmp/first_token.py <<'PY'
import subprocess, sys, time
t0 = time.time()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
first = p.stdout.read(1)
t1 = time.time()
rest = p.stdout.read()
err = p.stderr.read().decode(errors="replace")
p.wait()
print(f"first token after {t1 - t0:.2f} s, done after {time.time() - t0:.2f} s, exit {p.returncode}")
print((first + rest).decode(errors="replace")[:300])
if p.returncode:
    print(err[-2000:])
PY

if has start; then
  echo "== start to first token: generate 200 greedy tokens on cuda, cold then warm kernel cache"
  rm -rf "${XDG_CACHE_HOME:-$HOME/.cache}/cubecl"
  for start in cold warm; do
    echo "$start:"
    timeout -k 5 150 "$python" /tmp/first_token.py ./tinygpt generate --checkpoint "$run" \
      --backend cuda --prompt ROMEO: --max-new-tokens 200 --temperature 0
  done
  echo "== 200 tokens, greedy and sampled (seed 1337): each way of feeding a token on cuda against"
  echo "   the fused CPU decoder"
  for temperature in 0 0.8; do
    ./tinygpt generate --checkpoint "$run" --backend fused --prompt ROMEO: --max-new-tokens 200 \
      --temperature $temperature >/tmp/fused.txt 2>&1
    for mode in 0 step capture; do
      TINYGPT_DECODE_STEP=$mode timeout -k 5 120 ./tinygpt generate --checkpoint "$run" \
        --backend cuda --prompt ROMEO: --max-new-tokens 200 --temperature $temperature \
        >/tmp/cuda-$mode.txt 2>&1
      cmp -s /tmp/cuda-$mode.txt /tmp/fused.txt \
        && echo "temperature $temperature, decode step $mode: the fused decoder's tokens" \
        || { echo "temperature $temperature, decode step $mode: DIFFERS"; head -c 300 /tmp/cuda-$mode.txt; echo; }
    done
    head -c 200 /tmp/fused.txt; echo
  done
fi

if has eval; then
  echo "== eval on cuda and fused"
  for backend in cuda fused; do
    step 120 ./tinygpt eval --checkpoint "$run" --backend "$backend" --data "$data"
  done
fi

if has bench; then
  echo "== bench, sampling only, by decode step (0: forward_cached, step, capture)"
  # shakespeare-char: one window (255 tokens, no rebuild); baby: 500 with the context shift
  # (a 32-token refill every 32 tokens) and 200 with nanoGPT's exact window (a rebuild per
  # token past 63, first light's case).
  for mode in 0 step capture; do
    cases=("shakespeare-char 255" "baby 500 --context-shift")
    [ "$mode" = step ] && cases+=("baby 200")
    for case in "${cases[@]}"; do
      read -r config tokens shift <<<"$case"
      # shellcheck disable=SC2086
      step 120 env TINYGPT_DECODE_STEP=$mode ./tinygpt bench --config "$config" --backend cuda \
        --iters 0 --sample-tokens "$tokens" $shift --json | grep '^{' | tag "tinygpt-cuda-step-$mode"
    done
  done
fi

if has torch; then
  echo "== PyTorch, static KV cache (500 tokens; the cache restarts at the block)"
  small="--n-layer 4 --n-head 4 --n-embd 128 --block-size 64"
  large="--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --no-bias"
  for case in "shakespeare-char:$large:float32:" "shakespeare-char:$large:float32:--compile" \
    "baby:$small:float32:" ${TORCH_MORE:+"baby:$small:float32:--compile"} \
    ${TORCH_MORE:+"shakespeare-char:$large:bfloat16:" "shakespeare-char:$large:bfloat16:--compile"}; do
    IFS=: read -r config model dtype compile <<<"$case"
    # shellcheck disable=SC2086
    step 120 "$python" torch-sample.py --torch-gpt torch_gpt.py --device cuda --tokens 500 $model \
      --dtype "$dtype" $compile | grep '^{' | sed "s/^{/{\"config\": \"$config\", /" | tag torch
  done
fi

if has serve; then
  echo "== serve on cuda: one completion, then 32 streams"
  ./tinygpt serve --checkpoint "$run" --backend cuda --port 8199 >/tmp/serve.log 2>&1 &
  server=$!
  for _ in $(seq 240); do curl -sf http://127.0.0.1:8199/health >/dev/null && break; sleep 0.5; done
  t0=$(date +%s.%N)
  step 90 curl -s http://127.0.0.1:8199/v1/completions -H 'Content-Type: application/json' \
    -d '{"prompt": "ROMEO:", "max_tokens": 60, "temperature": 0}'
  echo "one completion: $(awk "BEGIN{print $(date +%s.%N) - $t0}") s"
  for clients in 32 32; do
    step 120 ./serve_load --url http://127.0.0.1:8199 --prompt "ROMEO:" --max-tokens 200 \
      --clients $clients --requests 1 | grep '^{' | tag "tinygpt-serve-cuda-$clients"
  done
  kill -INT $server; wait $server
  tail -5 /tmp/serve.log
fi

if has kernels; then
  echo "== the shakespeare-char training step's kernels, f32 and bf16"
  for dtype in f32 bf16; do
    step 150 ./tinygpt bench --config shakespeare-char --backend cuda --set train.dtype=$dtype \
      --iters 5 --warmup 2 --sample-tokens 20 --kernels 2
  done
fi
