#!/usr/bin/env bash
# The record table of docs/perf.md: each row trains on tiny shakespeare with --to-loss TARGET
# (default 1.8983, the whole-split loss nanoGPT's train.py reaches with its CPU baby config)
# for three seeds, evaluating every 100 steps (and at the end), at most the row's max_iters
# (2000 for baby and modern), on the fused engine. Prints
# one line per run: row, seed, the step the target was reached at (or "-" if not in 2000),
# seconds of training, and the val loss estimate at step 500 (equal steps). One program at a
# time; run nothing else.
#
#   scripts/record-table.sh INPUT_TXT [TARGET] [ROW ...]
set -euo pipefail
input=$(realpath "$1"); target=${2:-1.8983}; shift $(( $# >= 2 ? 2 : 1 ))
tinygpt=$(realpath "${TINYGPT:-target/release/tinygpt}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# name | config | settings
rows=(
  "baby|baby|"
  "baby + rope|baby|model.position=\"rope\""
  "baby + rms_unit|baby|model.norm=\"rms_unit\""
  "baby + qk_norm|baby|model.qk_norm=true"
  "baby + relu2|baby|model.mlp=\"relu2\""
  "baby, no biases|baby|model.bias=false"
  "baby, untied head|baby|model.tie_embeddings=false"
  "baby + softcap 15|baby|model.logit_softcap=15"
  "baby, zero-init projections|baby|model.proj_init=\"zero\""
  "modern|modern|"
  "modern + swiglu|modern|model.mlp=\"swiglu\""
  "modern as llama.cpp's llama|modern|model.mlp=\"swiglu\" model.qk_norm=false model.logit_softcap=0"
  "modern as llama.cpp's qwen3|modern|model.mlp=\"swiglu\" model.logit_softcap=0"
  "modern + muon|modern|train.optimizer=\"muon\""
  "modern + wsd (800 steps)|modern|train.lr_schedule=\"wsd\" train.max_iters=800"
  "modern, cosine over 800 steps|modern|train.max_iters=800"
  "modern, lr 2e-3|modern|train.learning_rate=2e-3 train.min_lr=2e-4"
  "modern, lr 3e-3|modern|train.learning_rate=3e-3 train.min_lr=3e-4"
  "modern, lr 5e-4|modern|train.learning_rate=5e-4 train.min_lr=5e-5"
  "modern, batch 24|modern|train.batch_size=24"
  "modern, batch 6|modern|train.batch_size=6"
  "modern, batch 4|modern|train.batch_size=4"
  "modern, batch 8|modern|train.batch_size=8"
  "modern + bigram|modern|model.bigram=true"
  "modern, embeddings' lr x10|modern|train.embedding_lr_ratio=10"
  "modern, head's lr x3|modern|train.head_lr_ratio=3"
  "modern + wsd (500 steps, half decaying)|modern|train.lr_schedule=\"wsd\" train.decay_fraction=0.5 train.max_iters=500 train.lr_decay_iters=500"
  "speedrun|speedrun|"
  "speedrun as before: 400 steps, peak 1e-3, beta2 0.99|speedrun|train.max_iters=400 train.lr_decay_iters=400 train.learning_rate=1e-3 train.beta2=0.99"
  "speedrun, 300 steps|speedrun|train.max_iters=300 train.lr_decay_iters=300"
  "speedrun, head's lr x3|speedrun|train.head_lr_ratio=3"
  "speedrun without the bigram|speedrun|model.bigram=false"
  "speedrun, embeddings' lr x1|speedrun|train.embedding_lr_ratio=1"
  "speedrun + muon|speedrun|train.optimizer=\"muon\""
)
wanted=("$@")
for row in "${rows[@]}"; do
  IFS='|' read -r name config settings <<<"$row"
  if ((${#wanted[@]})) && ! printf '%s\n' "${wanted[@]}" | grep -qxF "$name"; then continue; fi
  for seed in 1337 1 2; do
    args=(train --config "$config" --data "$input" --backend fused --to-loss "$target"
      --seed "$seed" --set train.eval_interval=100 --out "$work/run")
    for s in $settings; do args+=(--set "$s"); done
    rm -rf "$work/run"
    "$tinygpt" "${args[@]}" >"$work/log" 2>&1 || { tail -3 "$work/log"; exit 1; }
    at=$(grep -oP 'at step \K[0-9]+' "$work/log" || echo -)
    secs=$(grep -oP '^done: .*\(\K[0-9.]+(?=s training)' "$work/log")
    eq=$(grep -oP '^step 500: .*val loss \K[0-9.]+' "$work/log" || echo -)
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$seed" "$at" "$secs" "$eq"
  done
done
