#!/usr/bin/env bash
# Runs on the GPU machine, from the folder scripts/gpu-pack.sh filled (with a trained baby run
# in baby-run/: RUN=… scripts/gpu-pack.sh): `serve` on the GPU, each way of feeding a step's
# single tokens (TINYGPT_DECODE_STEP = capture: every stream a row, the step recorded and
# replayed; step: the same launch by launch; 0: a cache per stream, the way before), then the
# single stream's bench and the training step's attention kernels. Every step has a time limit;
# a failed step does not stop the others. JSON lines go to $RESULTS (default ./serve.jsonl).
#
#   ./gpu-serve.sh                      # about five minutes on an H100
#   PHASES="check load rows char single train" BACKEND=cuda WAYS="capture step 0" ./gpu-serve.sh
#
# check   8 greedy completions at once (120 tokens: past the baby's 64-token window, so every
#         token after it is a window rebuilt through its row), each against `generate` alone
#         on the fused CPU decoder
# load    serve_load: 32 streams, 50 tokens (inside the window: the step alone) and 200 (the
#         exact window, a rebuild per token past it)
# rows    `bench --streams 32`: the same 32 streams without HTTP (tokens/s of the step alone),
#         then the kernels of a step launch by launch (`--kernels`), 32 streams and one
# char    the same 32 streams at shakespeare-char's size (10.7M, untrained: one step on the
#         CPU), 200 tokens inside its 256-token window
# single  one stream: greedy tokens on the GPU against the fused decoder's, and `bench
#         --iters 0` at shakespeare-char's size, each with the rows kernel for decoding's
#         products and without (TINYGPT_ROWS_LINEAR=0), then its kernels launch by launch
# short   greedy tokens of the baby run after prompts of 1 to 6 tokens (1 to 4 rows go through
#         the rows kernel), on the GPU with the rows kernel and without, against the fused
#         decoder's
# half    one stream with bf16 matrices against f32 (`--weights bf16`) at shakespeare-char's
#         size (255 tokens) and the baby's (500, `--context-shift`), 32 streams through `bench
#         --streams` and through `serve`, the baby run's greedy text in bf16 against the fused
#         decoder's f32 one, and `eval` of the baby run with each
# train   the shakespeare-char and baby training steps, flash attention against explicit
# torch   PyTorch beside it (torch-sample.py: a static KV cache, eager and torch.compile'd), one
#         stream at shakespeare-char's size, f32 (TORCH_MORE=1: bf16 too)
#
# KERNELS=0 skips the launch-by-launch kernel listings of `rows` and `single`, NSYS=0 the
# Nsight Systems run of `single`: the figures alone, in less time.
set -uo pipefail
cd "$(dirname "$0")"
results="${RESULTS:-serve.jsonl}"
phases="${PHASES:-check load rows char single train}"
backend="${BACKEND:-cuda}"
ways="${WAYS:-capture step 0}"
python="${PYTHON:-python3}"
port=8199
for packed in tinygpt serve_load; do
  [ -f "$packed.xz" ] && [ ! -x "$packed" ] && xz -dk "$packed.xz" && chmod +x "$packed"
done
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
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }

# serve RUN WAY [serve args…]: a server in the background, $server its pid, once it answers.
serve_up() {
  local run=$1 way=$2
  shift 2
  TINYGPT_DECODE_STEP=$way ./tinygpt serve --checkpoint "$run" --backend "$backend" \
    --port $port --max-batch 32 "$@" >/tmp/serve.log 2>&1 &
  server=$!
  for _ in $(seq 240); do
    curl -sf http://127.0.0.1:$port/health >/dev/null && return 0
    kill -0 "$server" 2>/dev/null || break
    sleep 0.5
  done
  echo "server did not come up:"; tail -5 /tmp/serve.log; return 1
}
serve_down() {
  kill -INT "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  # What the server said of its step (recorded as a graph, or launch by launch and why).
  grep '^serve:' /tmp/serve.log | head -5
  tail -2 /tmp/serve.log
}
kernels() { [ "${KERNELS:-1}" != 0 ]; }
load() { # load TAG MAX_TOKENS
  step 150 ./serve_load --url http://127.0.0.1:$port --prompt "ROMEO:" --max-tokens "$2" \
    --clients 32 --requests 1 | grep '^{' | tag "$1"
}

if has check || has load; then
  for way in $ways; do
    echo "== [$(elapsed) s] baby, decode step $way"
    serve_up baby-run "$way" || { serve_down; continue; }
    has check && step 200 "$python" serve-check.py --url http://127.0.0.1:$port \
      --tinygpt ./tinygpt --checkpoint baby-run --max-tokens 120
    if has load; then
      load "baby-$way-50" 50
      load "baby-$way-50-again" 50
      load "baby-$way-200" 200
    fi
    serve_down
  done
fi

if has rows; then
  for config in ${ROWS_CONFIGS:-shakespeare-char baby}; do
    echo "== [$(elapsed) s] bench: 32 streams stepped together, $config, no HTTP"
    step 120 ./tinygpt bench --config $config --backend "$backend" --iters 0 --sample-tokens 200 \
      --streams 32 --json | grep '^{' | tag "rows-$config-32"
  done
  for streams in 32 1; do
    kernels || break
    echo "== [$(elapsed) s] the kernels of a sampling step launch by launch, $streams streams"
    step 120 env TINYGPT_DECODE_STEP=step ./tinygpt bench --config shakespeare-char \
      --backend "$backend" --iters 0 --sample-tokens 20 --streams $streams --kernels 20
  done
fi

if has char || has single; then
  echo "== [$(elapsed) s] shakespeare-char's size: one CPU step to have a run"
  step 120 ./tinygpt train --config shakespeare-char --data "$data" --out char-run --max-iters 1 \
    --backend fused --set train.eval_iters=1 --set train.batch_size=2 | tail -1
fi
if has char; then
  for way in ${CHAR_WAYS:-capture 0}; do
    echo "== [$(elapsed) s] shakespeare-char, decode step $way"
    serve_up char-run "$way" || { serve_down; continue; }
    load "char-$way-200" 200
    load "char-$way-200-again" 200
    echo "server's counters: $(curl -s http://127.0.0.1:$port/health | grep -o '"stats":{[^}]*}')"
    serve_down
  done
fi

if has single; then
  echo "== [$(elapsed) s] one stream: 200 greedy tokens of the baby run on $backend against fused"
  ./tinygpt generate --checkpoint baby-run --backend fused --prompt ROMEO: --max-new-tokens 200 \
    --temperature 0 >/tmp/fused.txt 2>&1
  for rows_linear in 1 0; do
    TINYGPT_ROWS_LINEAR=$rows_linear timeout -k 5 120 ./tinygpt generate --checkpoint baby-run \
      --backend "$backend" --prompt ROMEO: --max-new-tokens 200 --temperature 0 >/tmp/gpu.txt 2>&1
    cmp -s /tmp/gpu.txt /tmp/fused.txt && echo "rows kernel $rows_linear: the fused decoder's tokens" \
      || { echo "rows kernel $rows_linear: DIFFERS"; head -c 300 /tmp/gpu.txt; echo; }
  done
  for rows_linear in 1 0; do
    echo "== [$(elapsed) s] one stream, shakespeare-char's size, rows kernel $rows_linear"
    step 120 env TINYGPT_ROWS_LINEAR=$rows_linear ./tinygpt bench --config shakespeare-char \
      --backend "$backend" --iters 0 --sample-tokens 255 --json | grep '^{' \
      | tag "single-capture-rows-linear-$rows_linear"
  done
  kernels && echo "== [$(elapsed) s] the kernels of one stream's step, launch by launch"
  kernels && step 120 env TINYGPT_DECODE_STEP=step ./tinygpt bench --config shakespeare-char \
    --backend "$backend" --iters 0 --sample-tokens 20 --kernels 20 | grep -v "^config"
  nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  if [ "${NSYS:-1}" = 0 ]; then
    :
  elif [ -n "$nsys" ] && [ "$backend" = cuda ]; then
    echo "== [$(elapsed) s] the same under Nsight Systems: the kernels inside the replayed graph"
    step 150 "$nsys" profile --cuda-graph-trace=node --trace=cuda -o /tmp/single -f true \
      ./tinygpt bench --config shakespeare-char --backend cuda --iters 0 --sample-tokens 255 \
      | tail -3
    step 120 "$nsys" stats --report cuda_gpu_kern_sum,cuda_api_sum --format csv /tmp/single.nsys-rep \
      >/tmp/single-stats.txt
    head -c 6000 /tmp/single-stats.txt
    [ -n "${OUT:-}" ] && cp /tmp/single-stats.txt "$OUT/"
  else
    echo "(no nsys here)"
  fi
fi

if has short; then
  echo "== [$(elapsed) s] short prompts: greedy tokens on $backend against fused"
  for prompt in K KI KIN KING "KING " ROMEO; do
    ./tinygpt generate --checkpoint baby-run --backend fused --prompt "$prompt" \
      --max-new-tokens 40 --temperature 0 >/tmp/fused.txt 2>/dev/null
    for rows_linear in ${SHORT_ROWS:-1 0}; do
      TINYGPT_ROWS_LINEAR=$rows_linear timeout -k 5 120 ./tinygpt generate --checkpoint baby-run \
        --backend "$backend" --prompt "$prompt" --max-new-tokens 40 --temperature 0 \
        >/tmp/gpu.txt 2>/dev/null
      cmp -s /tmp/gpu.txt /tmp/fused.txt && echo "'$prompt', rows kernel $rows_linear: same" \
        || echo "'$prompt', rows kernel $rows_linear: DIFFERS: $(head -c 50 /tmp/gpu.txt | tr '\n' '|')" \
          "(fused: $(head -c 50 /tmp/fused.txt | tr '\n' '|'))"
    done
  done
fi

if has half; then
  for weights in f32 bf16; do
    echo "== [$(elapsed) s] one stream, $weights matrices: shakespeare-char, then baby"
    step 120 ./tinygpt bench --config shakespeare-char --backend "$backend" --iters 0 \
      --sample-tokens 255 --weights $weights --json | grep '^{' | tag "single-char-$weights"
    step 120 ./tinygpt bench --config baby --backend "$backend" --iters 0 --sample-tokens 500 \
      --context-shift --weights $weights --json | grep '^{' | tag "single-baby-$weights"
    step 120 ./tinygpt bench --config shakespeare-char --backend "$backend" --iters 0 \
      --sample-tokens 200 --streams 32 --weights $weights --json | grep '^{' \
      | tag "rows-char-32-$weights"
    ./tinygpt eval --checkpoint baby-run --data "$data" --backend "$backend" --weights $weights 2>&1 | tail -1
  done
  echo "== [$(elapsed) s] the baby run's greedy text, bf16 on $backend against f32 on fused"
  ./tinygpt generate --checkpoint baby-run --backend fused --prompt ROMEO: --max-new-tokens 300 \
    --temperature 0 >/tmp/fused.txt 2>&1
  for weights in f32 bf16; do
    timeout -k 5 120 ./tinygpt generate --checkpoint baby-run --backend "$backend" \
      --weights $weights --prompt ROMEO: --max-new-tokens 300 --temperature 0 >/tmp/half.txt 2>&1
    "$python" -c 'import os, sys; a, b = (open(f).read() for f in sys.argv[1:3]); \
      print(f"{sys.argv[3]}: the first {len(os.path.commonprefix([a, b]))} of {len(b)} characters the same")' \
      /tmp/half.txt /tmp/fused.txt $weights
    head -c 200 /tmp/half.txt; echo
  done
  if [ -d char-run ] && serve_up char-run capture --weights bf16; then
    echo "== [$(elapsed) s] serve, shakespeare-char, bf16 matrices"
    load "char-capture-200-bf16" 200
    load "char-capture-200-bf16-again" 200
    serve_down
  fi
fi

if has train && [ "$(elapsed)" -gt "${TRAIN_AFTER:-1000}" ]; then
  echo "== [$(elapsed) s] training steps skipped: past TRAIN_AFTER seconds"
elif has train; then
  for config in shakespeare-char baby; do
    for kernel in flash explicit; do
      echo "== [$(elapsed) s] training step, $config, attention $kernel"
      step 150 ./tinygpt bench --config "$config" --backend "$backend" --iters 8 --warmup 3 \
        --sample-tokens 0 --set train.attention_kernel=$kernel --json \
        | grep '^{' | tag "train-$config-$kernel"
    done
  done
fi
if has torch; then
  large="--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --no-bias"
  for case in "float32:" "float32:--compile" ${TORCH_MORE:+"bfloat16:" "bfloat16:--compile"}; do
    IFS=: read -r dtype compile <<<"$case"
    echo "== [$(elapsed) s] PyTorch, static KV cache, shakespeare-char's size, $dtype $compile"
    # shellcheck disable=SC2086
    step 120 "$python" torch-sample.py --torch-gpt torch_gpt.py --device cuda --tokens 500 $large \
      --dtype "$dtype" $compile | grep '^{' | tag "torch-shakespeare-char-$dtype${compile:+-compiled}"
  done
fi
echo "== done after $(elapsed) s"
[ -n "${OUT:-}" ] && cp "$results" "$OUT/"
