#!/usr/bin/env bash
# Runs on the GPU machine, from the folder scripts/gpu-pack.sh filled: nanoGPT's shakespeare-char
# run, 5000 steps, beside PyTorch's on the same GPU, in wall time from process start:
#
# tinygpt  `train --config shakespeare-char` in bf16 on CUDA (its evaluations every 250 steps
#          included), then `eval`: the whole validation split, the figure nanoGPT's 1.4697 is
# torch    `torch_gpt.py train` with nanoGPT's GPU settings (bf16 autocast, TF32,
#          torch.compile, fused AdamW) and its shakespeare-char hyper-parameters, 5000 steps; its
#          val loss is a 200-batch estimate (nanoGPT's own `eval_iters`), not the whole split
# modern   tinygpt with the `modern` preset's parts at the same size, stopped at the first
#          evaluation whose whole-split loss is at most 1.4697 (`--to-loss`): how many steps and
#          seconds the newer parts take to nanoGPT's loss
#
#   ./gpu-full-run.sh                       # about eight minutes on an H100 or H200
#   PHASES="tinygpt torch" ./gpu-full-run.sh
#   BACKEND=flex DTYPE=f32 STEPS=3 LIMIT=200 ./gpu-full-run.sh     # the script itself, anywhere
#
# Every phase has a time limit (LIMIT seconds, default 300). JSON lines go to $RESULTS (default
# ./full.jsonl); the logs beside it.
set -uo pipefail
cd "$(dirname "$0")"
results="${RESULTS:-full.jsonl}"
phases="${PHASES:-tinygpt torch modern}"
python="${PYTHON:-python3}"
limit="${LIMIT:-300}"
backend="${BACKEND:-cuda}"
dtype="${DTYPE:-bf16}"
steps="${STEPS:-5000}"
logs="$(dirname "$results")"
[ -f tinygpt.xz ] && [ ! -x tinygpt ] && xz -dk tinygpt.xz && chmod +x tinygpt
has() { case " $phases " in *" $1 "*) return 0 ;; esac; return 1; }
now() { date +%s.%N; }
seconds() { awk "BEGIN{printf \"%.1f\", $2 - $1}"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
data=tinyshakespeare.txt
loss_of() { grep -o 'loss [0-9.]*' | head -1 | cut -d' ' -f2; }

if has tinygpt; then
  echo "== tinygpt, shakespeare-char, $steps steps, $dtype"
  rm -rf sc-bf16
  start=$(now)
  timeout -k 5 "$limit" ./tinygpt train --config shakespeare-char --data "$data" --out sc-bf16 \
    --backend "$backend" --set train.dtype="$dtype" --max-iters "$steps" \
    >"$logs/tinygpt-train.log" 2>&1
  end=$(now)
  grep -E "^step [0-9]+:" "$logs/tinygpt-train.log" | tail -3
  val=$(./tinygpt eval --checkpoint sc-bf16 --which last --backend "$backend" 2>&1 | tee -a "$logs/tinygpt-train.log" | loss_of)
  echo "{\"who\": \"tinygpt-$dtype\", \"steps\": $steps, \"wall_s\": $(seconds "$start" "$end"), \"val_whole_split\": ${val:-null}}" | tee -a "$results"
fi

if has torch; then
  echo "== PyTorch, shakespeare-char, $steps steps, bf16 + TF32 + torch.compile"
  start=$(now)
  timeout -k 5 "$limit" "$python" torch_gpt.py train --data "$data" --n-layer 6 --n-head 6 \
    --n-embd 384 --block-size 256 --batch-size 64 --dropout 0.2 --no-bias --device cuda \
    --dtype bfloat16 --tf32 --compile --iters "$steps" --warmup 100 --eval-iters 200 \
    --sample-tokens 0 >"$logs/torch-train.log" 2>&1
  end=$(now)
  line=$(grep '^{"phase": "train"' "$logs/torch-train.log" | head -1)
  tail -2 "$logs/torch-train.log"
  echo "{\"who\": \"torch-bf16-compile\", \"steps\": $steps, \"wall_s\": $(seconds "$start" "$end"), \"run\": ${line:-null}}" | tee -a "$results"
fi

if has modern; then
  echo "== tinygpt, the modern parts at shakespeare-char's size, $dtype, to nanoGPT's 1.4697"
  rm -rf sc-modern
  start=$(now)
  timeout -k 5 "$limit" ./tinygpt train --config shakespeare-char --data "$data" --out sc-modern \
    --backend "$backend" --set train.dtype="$dtype" --max-iters "$steps" \
    --set model.position=rope --set model.norm=rms_unit \
    --set model.qk_norm=true --set model.mlp=relu2 --set model.logit_softcap=15 \
    --set model.proj_init=zero --set model.tie_embeddings=false --to-loss 1.4697 \
    >"$logs/modern-train.log" 2>&1
  end=$(now)
  grep -E "^step [0-9]+:|loss|reached|stopp" "$logs/modern-train.log" | tail -4
  echo "{\"who\": \"tinygpt-modern-$dtype\", \"to_loss\": 1.4697, \"wall_s\": $(seconds "$start" "$end")}" | tee -a "$results"
fi
