#!/usr/bin/env bash
# Serve under load, the figures in docs/perf.md ("Serving"): a run served on the fused CPU
# decoder (BACKEND=flex for Burn's), `examples/serve_load.rs` at 1, 8, 32 and 128 clients, with
# one row per worker (--max-batch 1: one generation per worker, as before continuous batching)
# and with batches (BATCHES="1 16"), exact window and --context-shift, at CASES="1 8,8 2,32 1,
# 128 1" (clients and requests each). One JSON line per case on stdout.
#
#   scripts/serve-load.sh RUN [MAX_TOKENS]      (SERVE_ARGS="--which last" for a run without best weights)
set -euo pipefail
run=${1:?usage: scripts/serve-load.sh RUN [MAX_TOKENS]}
max_tokens=${2:-200}
bin=${TINYGPT:-target/release/tinygpt}
load=${SERVE_LOAD:-target/release/examples/serve_load}
port=8181
for shift in "" "--context-shift"; do
  for batch in ${BATCHES:-1 16}; do
    "$bin" serve --checkpoint "$run" --port $port --backend "${BACKEND:-fused}" --queue 256 \
      --max-batch $batch $shift ${SERVE_ARGS:-} >/dev/null 2>&1 &
    server=$!
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
    IFS=, read -ra cases <<< "${CASES:-1 8,8 2,32 1,128 1}"
    for case in "${cases[@]}"; do
      set -- $case
      line=$("$load" --url "http://127.0.0.1:$port" --prompt "Of Man's first" \
        --max-tokens "$max_tokens" --clients "$1" --requests "$2")
      echo "{\"max_batch\": $batch, \"context_shift\": \"${shift}\", \"result\": $line}"
    done
    kill -INT $server; wait $server || true
  done
done
