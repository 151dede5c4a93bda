#!/usr/bin/env bash
# Data-parallel over two processes on this machine, side by side: nanoGPT's train.py under
# `torchrun --nproc_per_node=2` (gloo, one thread a process) against `mpirun -np 2 tinygpt
# train` (the fused engine, one thread a rank), and each in one process of two threads. The
# model is nanoGPT's README CPU "baby" (4 layers, 4 heads, width 128, block 64), the global
# batch 2 micro-batches of 12, STEPS steps (default 200), evaluated at the end on 20 batches.
# Prints training tokens/s (evaluations left out) and the validation loss at the last step.
# One program at a time; run nothing else.
#
#   scripts/torchrun-vs-mpi.sh NANOGPT_DIR PYTHON INPUT_TXT [STEPS]
#
# NANOGPT_DIR: a checkout of nanoGPT; PYTHON: one with torch and numpy (its torchrun beside it);
# tinygpt: $TINYGPT, default target/release/tinygpt, built with --features mpi.
set -euo pipefail
nanogpt=$(realpath "$1"); python=$2; input=$(realpath "$3"); steps=${4:-200}
tinygpt=$(realpath "${TINYGPT:-target/release/tinygpt}")
torchrun="$(dirname "$python")/torchrun"
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

# shellcheck source=scripts/nanogpt-workdir.sh
source "$(dirname "$0")/nanogpt-workdir.sh"
nanogpt_workdir "$nanogpt" "$python" "$input" "$work"
# train.py's DDP branch puts each rank on a GPU; on the CPU it must stay there (three lines).
sed -i "s/^    device = f'cuda:{ddp_local_rank}'/    device = device if device == 'cpu' else f'cuda:{ddp_local_rank}'/;
        s/^    torch.cuda.set_device(device)/    if device != 'cpu': torch.cuda.set_device(device)/;
        s/^    model = DDP(model, device_ids=\[ddp_local_rank\])/    model = DDP(model, device_ids=None if device == 'cpu' else [ddp_local_rank])/" \
  "$work/train.py"
grep -q "device_ids=None if device == 'cpu'" "$work/train.py" ||
  { echo "nanoGPT's train.py has changed: its DDP branch was not patched for the CPU"; exit 1; }

nano_args=(config/train_shakespeare_char.py --device=cpu --compile=False --backend=gloo
  --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4
  --n_embd=128 --max_iters="$steps" --lr_decay_iters=2000 --dropout=0.0
  --eval_interval="$steps" --gradient_accumulation_steps=2 --always_save_checkpoint=False)

# tokens/s over the iterations that did not evaluate (iteration 0 and the last did), and the
# validation loss at the last step.
nano_report() {
  awk -v steps="$steps" -v tokens=$((2 * 12 * 64)) '
    /^iter [0-9]+:/ { it = $2 + 0; t = $6; sub("ms,", "", t);
      if (it > 0 && it < steps) { s += t; n++ } }
    /^step [0-9]+: train loss/ { val = $NF }
    END { printf "%.0f tokens/s, val loss %s\n", n * tokens / (s / 1000), val }' "$1"
}

echo "nanoGPT, 1 process x 2 threads:"
(cd "$work" && OMP_NUM_THREADS=2 "$python" train.py "${nano_args[@]}" --out_dir=out1 \
  >"$work/nano1.log" 2>&1) || { tail -5 "$work/nano1.log"; exit 1; }
nano_report "$work/nano1.log"

echo "nanoGPT, torchrun --nproc_per_node=2 (gloo) x 1 thread:"
(cd "$work" && OMP_NUM_THREADS=1 "$torchrun" --standalone --nproc_per_node=2 train.py \
  "${nano_args[@]}" --out_dir=out2 >"$work/nano2.log" 2>&1) || { tail -5 "$work/nano2.log"; exit 1; }
nano_report "$work/nano2.log"

tiny_args=(train --config baby --data "$input" --backend fused --max-iters "$steps"
  --set train.grad_accum=2 --set train.eval_interval="$steps" --set train.eval_iters=20
  --set train.lr_decay_iters=2000 --set model.dropout=0 --set train.sample_tokens=0)
tiny_report() {
  local done val
  done=$(grep '^done:' "$1")
  val=$(grep -o 'val loss [0-9.]*' "$1" | tail -1)
  echo "$(echo "$done" | grep -o '[0-9]* training tokens/s'), $val"
}

echo "tinygpt, 1 process x 2 threads:"
"$tinygpt" "${tiny_args[@]}" --out "$work/tiny1" --set train.threads=2 >"$work/tiny1.log" 2>&1 ||
  { tail -5 "$work/tiny1.log"; exit 1; }
tiny_report "$work/tiny1.log"

echo "tinygpt, mpirun -np 2 x 1 thread:"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun -np 2 --bind-to none --oversubscribe "$tinygpt" "${tiny_args[@]}" --out "$work/tiny2" \
  >"$work/tiny2.log" 2>&1 || { tail -5 "$work/tiny2.log"; exit 1; }
tiny_report "$work/tiny2.log"
