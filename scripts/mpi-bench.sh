#!/usr/bin/env bash
# Two ranks against one process on this machine: the same run (global batch, grad_accum 2) as
# 1 process × T threads and as 2 ranks × T/2 threads (mpirun), training tokens/s of each from
# the run's summary, two runs each, best kept; prints the ratio. What the all-reduce costs.
# usage: scripts/mpi-bench.sh TINYGPT_BUILT_WITH_MPI CORPUS [STEPS] [CONFIGS...]
set -euo pipefail
bin=$1; corpus=$2; steps=${3:-200}; shift $(( $# < 3 ? $# : 3 ))
configs=("${@:-baby modern}")
threads=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
common=(--data "$corpus" --backend fused --max-iters "$steps" --set train.grad_accum=2
  --set "train.eval_interval=$steps" --set train.eval_iters=1 --set train.sample_tokens=0)
rate() { grep -o '[0-9]* training tokens/s' "$1" | grep -o '^[0-9]*'; }
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads; $(date -u +%F)"
for config in ${configs[@]}; do
  best_one=0; best_two=0
  for try in 1 2; do
    "$bin" train --config "$config" --out "$work/one-$config-$try" "${common[@]}" \
      --set "train.threads=$threads" > "$work/one.log" 2>&1
    mpirun --oversubscribe --bind-to none -np 2 "$bin" train --config "$config" \
      --out "$work/two-$config-$try" "${common[@]}" > "$work/two.log" 2>&1
    one=$(rate "$work/one.log"); two=$(rate "$work/two.log")
    (( one > best_one )) && best_one=$one; (( two > best_two )) && best_two=$two
  done
  ratio=$(python3 -c "print(f'{$best_two / $best_one:.2f}')")
  echo "$config: 1 process x $threads threads $best_one tokens/s | 2 ranks x $((threads / 2)) $best_two tokens/s | ${ratio}x"
done
