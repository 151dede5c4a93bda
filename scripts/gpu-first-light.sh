#!/usr/bin/env bash
# Runs on the GPU machine, from the folder scripts/gpu-pack.sh filled: every command once on
# `--backend cuda`, each beside the fused CPU engine from the same seed, so a failure names the
# command it is in. Each step has a time limit (STEP_TIMEOUT seconds, default 240) and prints its
# exit status; nothing stops the steps after a failed one.
#
#   ./gpu-first-light.sh            # then ./gpu-run.sh for the speed figures
#
# 1. a cold and a warm start: the same short command twice, the first with an empty kernel
#    cache (~/.cache/cubecl: compiled kernels and autotune results), the second with it filled;
# 2. the step-0 losses (20 evaluation batches) on fused, cuda bf16, and cuda with the explicit
#    attention instead of flash, beside cuda f32's from the starts above;
# 3. the baby config trained 200 steps on cuda (wall time), then `eval` of that run on cuda and on
#    fused, greedy `generate` on both, and one `serve` completion on cuda.
set -uo pipefail
cd "$(dirname "$0")"
[ -f tinygpt.xz ] && [ ! -x tinygpt ] && xz -dk tinygpt.xz && chmod +x tinygpt
step() {
  echo "-- $*"
  timeout -k 5 "${STEP_TIMEOUT:-240}" "$@" 2>&1
  echo "[exit $?]"
}
data=tinyshakespeare.txt

seconds() { awk "BEGIN{print $(date +%s.%N) - $1}"; }

echo "== cold and warm start: baby, step 0 on cuda, twice"
rm -rf "${XDG_CACHE_HOME:-$HOME/.cache}/cubecl"
for start in cold warm; do
  rm -rf /tmp/fl-start
  t0=$(date +%s.%N)
  step ./tinygpt train --config baby --data "$data" --backend cuda --max-iters 0 \
    --set train.eval_iters=20 --out /tmp/fl-start | grep -E "^(step 0|tinygpt|\[exit|--)"
  echo "$start start: $(seconds "$t0") s"
done

echo "== step-0 losses, seed 1337"
for case in "fused" "cuda train.dtype=bf16" "cuda train.attention_kernel=explicit"; do
  read -r backend set <<<"$case"
  out="/tmp/fl-step0-${backend}-${set//[^a-z0-9]/_}"
  rm -rf "$out"
  step ./tinygpt train --config baby --data "$data" --backend "$backend" --max-iters 0 \
    --set train.eval_iters=20 ${set:+--set "$set"} --out "$out" | grep -E "^(step 0|tinygpt|\[exit|--|error|thread)"
done

echo "== baby, 200 steps on cuda"
run=/tmp/fl-baby
rm -rf "$run"
t0=$(date +%s.%N)
step ./tinygpt train --config baby --data "$data" --backend cuda --max-iters 200 \
  --set train.eval_interval=100 --set train.eval_iters=20 --out "$run" | tail -30
echo "wall: $(seconds "$t0") s"
for backend in cuda fused; do
  step ./tinygpt eval --checkpoint "$run" --backend "$backend"
done
for backend in cuda fused; do
  step ./tinygpt generate --checkpoint "$run" --backend "$backend" --prompt "ROMEO:" \
    --max-new-tokens 60 --temperature 0
done

echo "== serve on cuda, one completion"
./tinygpt serve --checkpoint "$run" --backend cuda --port 8199 >/tmp/fl-serve.log 2>&1 &
server=$!
python3 - <<'PY'
import json, time, urllib.request
base = "http://127.0.0.1:8199"
for _ in range(120):
    try:
        print("health:", urllib.request.urlopen(base + "/health", timeout=2).read().decode()[:300])
        break
    except Exception:
        time.sleep(0.5)
body = json.dumps({"prompt": "ROMEO:", "max_tokens": 60, "temperature": 0}).encode()
req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
try:
    t = time.time()
    answer = json.loads(urllib.request.urlopen(req, timeout=60).read())
    print(f"completion ({time.time() - t:.2f} s):", repr(answer["choices"][0]["text"]))
except Exception as e:
    print("completion failed:", e)
PY
kill "$server" 2>/dev/null
wait "$server" 2>/dev/null
tail -5 /tmp/fl-serve.log
