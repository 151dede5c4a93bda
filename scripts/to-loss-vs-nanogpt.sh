#!/usr/bin/env bash
# Time to nanoGPT's own loss, side by side on this machine: nanoGPT's train.py trains its CPU
# "baby" config for 2000 steps on tiny shakespeare; its checkpoint's loss over the whole
# validation split (tinygpt eval) is the target; tinygpt then trains CONFIG with --to-loss to
# that target (once per seed in SEEDS, default 1337). Prints both times and their ratio. One
# program at a time; run nothing else. tinygpt evaluates where CONFIG says (train.eval_interval:
# every 250 steps in baby and modern, as nanoGPT's; only at its end in speedrun), or every
# EVAL_INTERVAL steps when that is set.
#
#   [SEEDS="1337 1 2"] [EVAL_INTERVAL=N] scripts/to-loss-vs-nanogpt.sh NANOGPT_DIR PYTHON INPUT_TXT [CONFIG]
#
# NANOGPT_DIR: a checkout of nanoGPT; PYTHON: one with torch and numpy; INPUT_TXT: tiny
# shakespeare (or another text: nanoGPT's char prepare.py reads any); CONFIG: a tinygpt preset
# or file (default: modern).
set -euo pipefail
nanogpt=$(realpath "$1"); python=$2; input=$(realpath "$3"); config=${4:-modern}
tinygpt=${TINYGPT:-target/release/tinygpt}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# shellcheck source=scripts/nanogpt-workdir.sh
source "$(dirname "$0")/nanogpt-workdir.sh"
nanogpt_workdir "$nanogpt" "$python" "$input" "$work"

# nanoGPT's README, "I only have a macbook": the baby model on the CPU.
start=$(date +%s.%N)
(cd "$work" && "$python" train.py config/train_shakespeare_char.py \
  --device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64 \
  --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 \
  --lr_decay_iters=2000 --dropout=0.0 --out_dir=out >"$work/nanogpt.log" 2>&1) ||
  { echo "nanoGPT's train.py failed:"; tail -5 "$work/nanogpt.log"; exit 1; }
nano_wall=$(echo "$(date +%s.%N) - $start" | bc)
# Its iterations' times, less those that also evaluated (every 250).
nano_train=$(awk '/^iter [0-9]+:/ { it = $2 + 0; t = $6; sub("ms,", "", t);
  if (it % 250 != 0) s += t } END { printf "%.1f", s / 1000 }' "$work/nanogpt.log")

"$tinygpt" import --from "$work/out/ckpt.pt" --meta "$work/data/shakespeare_char/meta.pkl" \
  --out "$work/nano-run" >/dev/null
"$python" -c "import sys; d = open(sys.argv[1]).read(); open(sys.argv[2], 'w').write(d[int(len(d) * 0.9):])" \
  "$input" "$work/val.txt"
target=$("$tinygpt" eval --checkpoint "$work/nano-run" --data "$work/val.txt" |
  sed -E 's/.*\| loss ([0-9.]+) .*/\1/')

echo "target: nanoGPT's whole-split val loss after 2000 steps = $target"
echo "nanoGPT train.py (baby):   ${nano_train}s of training, $(printf %.1f "$nano_wall")s wall"
status=0
for seed in ${SEEDS:-1337}; do
  rm -rf "$work/tiny"
  start=$(date +%s.%N)
  "$tinygpt" train --config "$config" --data "$input" --out "$work/tiny" --to-loss "$target" \
    --seed "$seed" ${EVAL_INTERVAL:+--set train.eval_interval=$EVAL_INTERVAL} \
    --set train.eval_iters=20 --set train.sample_tokens=0 >"$work/tinygpt.log"
  tiny_wall=$(echo "$(date +%s.%N) - $start" | bc)
  reached=$(grep -E '^reached' "$work/tinygpt.log" || true)
  if [ -z "$reached" ]; then
    echo "tinygpt --config $config, seed $seed: did not reach $target: $(tail -1 "$work/tinygpt.log")"
    status=1
    continue
  fi
  tiny_train=$(echo "$reached" | sed -E 's/.*: ([0-9.]+)s of training.*/\1/')
  echo "tinygpt --config $config, seed $seed: ${tiny_train}s of training, $(printf %.1f "$tiny_wall")s wall ($reached)"
  echo "ratio, seed $seed: $(echo "scale=2; $nano_train / $tiny_train" | bc)x training time, $(echo "scale=2; $nano_wall / $tiny_wall" | bc)x wall"
done
exit $status
