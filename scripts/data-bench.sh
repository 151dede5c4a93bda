#!/usr/bin/env bash
# Prepare throughput and memory, and training start-up and memory on prepared directories, for
# corpora of growing size built by repeating a text.
#
#   scripts/data-bench.sh TEXT [SIZES_MB...]     (default sizes: 10 100 1000)
#
# Needs a release build (cargo build --release) and GNU time (/usr/bin/time).
set -euo pipefail
text=${1:?usage: scripts/data-bench.sh TEXT [SIZES_MB...]}
shift
sizes=("${@:-10 100 1000}")
bin=${TINYGPT:-${CARGO_TARGET_DIR:-target}/release/tinygpt}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rss() { awk '/Maximum resident/ {printf "%.0f", $6/1024}' "$1"; }
wall() { awk '/Elapsed/ {print $8}' "$1"; }
printf "%-8s %-5s %12s %13s %10s %14s %16s %14s\n" corpus tok "prepare MB/s" "encoding MB/s" "peak MiB" \
  "train start s" "train peak MiB" "prepare wall"
for mb in ${sizes[@]}; do
  corpus="$work/corpus-$mb.txt"
  : > "$corpus"
  while [ "$(stat -c %s "$corpus")" -lt $((mb * 1000000)) ]; do cat "$text" >> "$corpus"; done
  truncate -s $((mb * 1000000)) "$corpus"
  for tok in char bpe; do
    out="$work/p-$mb-$tok"
    /usr/bin/time -v "$bin" prepare --data "$corpus" --out "$out" --tokenizer "$tok" \
      --bpe-vocab-size 2048 > "$work/log" 2> "$work/time"
    speed=$(grep -o '([0-9.]* MB/s)' "$work/log" | head -1 | tr -d '()MB/s ')
    encoding=$(grep -o '([0-9.]* MB/s)' "$work/log" | sed -n 2p | tr -d '()MB/s ')
    prep_rss=$(rss "$work/time"); prep_wall=$(wall "$work/time")
    start=$(date +%s.%N)
    /usr/bin/time -v "$bin" train --config baby --data "$out" --out "$work/run-$mb-$tok" \
      --max-iters 1 --set train.eval_iters=1 > /dev/null 2> "$work/time"
    end=$(date +%s.%N)
    printf "%-8s %-5s %12s %13s %10s %14.2f %16s %14s\n" "${mb}MB" "$tok" "$speed" "$encoding" "$prep_rss" \
      "$(echo "$end - $start" | bc)" "$(rss "$work/time")" "$prep_wall"
    rm -rf "$out" "$work/run-$mb-$tok"
  done
  rm -f "$corpus"
done
