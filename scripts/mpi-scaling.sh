#!/usr/bin/env bash
# The parts of the model of a step on N machines (docs/distributed.md), measured on this one:
# each preset's step at one and two micro-batches (one process, the fused engine: the
# micro-batch's compute and the update's), and the all-reduce of its trained gradients over two
# ranks on loopback TCP and across two network namespaces joined by a veth link shaped to 10
# and 1 Gbit/s (scripts/mpi-net.sh; root). Writes JSON lines to OUT/steps.jsonl and
# OUT/reduce.jsonl; scripts/mpi-model.py OUT prints the model.
#
#   cargo build --release --features mpi
#   python scripts/smollm2-shape.py SmolLM2-135M-shape input.txt   # torch, transformers
#   tinygpt import --from SmolLM2-135M-shape --block-size 1024 --out smol
#   scripts/mpi-scaling.sh target/release/tinygpt smol/config.toml OUT
set -euo pipefail
bin=$(realpath "$1")
smol=$(realpath "$2")
out=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
: > "$out/steps.jsonl"
: > "$out/reduce.jsonl"

# name, config, micro-batch rows, extra settings
presets=(
    "baby|baby|6|"
    "modern-64|modern|32|"
    "135m|$smol|1|"
    "135m-lora16|$smol|1|--set lora.rank=16"
)

for p in "${presets[@]}"; do
    IFS='|' read -r name config rows extra <<< "$p"
    for accum in 1 2; do
        # shellcheck disable=SC2086
        "$bin" bench --config "$config" --backend fused --json --sample-tokens 0 \
            --iters "${ITERS:-5}" --warmup 1 --set "train.batch_size=$rows" \
            --set "train.grad_accum=$accum" --set model.dropout=0 $extra |
            python3 -c "import json,sys; r=json.loads(sys.stdin.readline()); r['name']='$name'; r['grad_accum']=$accum; print(json.dumps(r))" \
            >> "$out/steps.jsonl"
    done
done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
reduce() {
    local link=$1
    shift
    for p in "${presets[@]}"; do
        IFS='|' read -r name config rows extra <<< "$p"
        # shellcheck disable=SC2086
        "$@" "$bin" bench --all-reduce --json --config "$config" --iters "${ROUNDS:-5}" \
            --warmup 1 $extra |
            python3 -c "import json,sys; r=json.loads(sys.stdin.readline()); r['name']='$name'; r['link']='$link'; print(json.dumps(r))" \
            >> "$out/reduce.jsonl"
    done
}
reduce loopback mpirun -np 2 --bind-to none --oversubscribe --mca btl tcp,self \
    --mca btl_tcp_if_include lo
reduce 10gbit "$here/mpi-net.sh" 10gbit
reduce 1gbit "$here/mpi-net.sh" 1gbit
python3 "$here/mpi-model.py" "$out"
