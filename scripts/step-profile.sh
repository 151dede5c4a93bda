#!/usr/bin/env bash
# Where the fused training step's time goes on this machine: `perf record` (its CPU clock: no
# hardware counters needed) of `tinygpt bench` on CONFIG's fused step, the samples grouped by
# kernel (the products' micro-kernels and their packing, the norms, softmax, the activation,
# the optimizer, clipping, copies, the rest). Prints a Markdown table of shares and the CPU's
# model name and vector extensions, for docs/perf.md's breakdown per machine kind.
#
#   scripts/step-profile.sh [CONFIG] [ITERS]        # default: baby, 200
#
# TINYGPT: the binary (default: target/release/tinygpt). Needs `perf` (Debian's linux-perf).
# Run nothing else meanwhile.
set -euo pipefail
config=${1:-baby}
iters=${2:-200}
tinygpt=${TINYGPT:-target/release/tinygpt}
data=$(mktemp)
trap 'rm -f "$data" "$data.old"' EXIT

perf record -F 2000 -o "$data" -- "$tinygpt" bench --config "$config" --backend fused \
    --iters "$iters" --warmup 3 --sample-tokens 0 >/dev/null 2>&1
field() { grep -m1 "^$1" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'; }
echo "$(field 'model name') (family $(field 'cpu family') model $(field 'model[[:space:]]*:')), \
$(nproc) CPUs, $(field flags | grep -o 'avx512f\|avx512vl\|avx512_bf16\|avx2\|fma' | sort -u | tr '\n' ' ')"
perf report -i "$data" --no-children --sort symbol --stdio 2>/dev/null | python3 -c '
import re, sys
# Each kind of work, by the symbols it runs in (first match wins).
KINDS = [
    ("products: micro-kernels", r"gemm_f32::microkernel|gemm_basic"),
    ("products: packing", r"gemm_common|gemm_f32::gemm"),
    ("norms (LayerNorm, RMSNorm)", r"layer_norm|rms_norm"),
    ("attention (softmax, rows)", r"attention|softmax"),
    ("activation (GELU, ReLU², SwiGLU)", r"gelu|relu|swiglu|silu"),
    ("optimizer (AdamW, Muon)", r"adamw|muon|newton"),
    ("gradient norm and clipping", r"clip_grad|norm_sq|::norm"),
    ("copies and zeroing (memmove, memset)", r"memmove|memset|memcpy"),
    ("the step\x27s own loops (Job::run, matrix_backward, embeddings)", r"tinygpt_model::cpu"),
    ("kernel (page faults, scheduling)", r"^\[k\]"),
]
shares = {name: 0.0 for name, _ in KINDS}
other = 0.0
for line in sys.stdin:
    m = re.match(r"\s+([\d.]+)%\s+(\[[.k]\])\s+(\S.*?)\s*(-\s+-)?\s*$", line)
    if not m:
        continue
    share, where, symbol = float(m.group(1)), m.group(2), m.group(3)
    text = where + " " + symbol if where == "[k]" else symbol
    for name, pattern in KINDS:
        if re.search(pattern, text if pattern.startswith("^") else symbol):
            shares[name] += share
            break
    else:
        other += share
print("| where | share of the samples |")
print("|---|---:|")
for name, _ in KINDS:
    print(f"| {name} | {shares[name]:.1f}% |")
print(f"| other (allocator, RNG, Burn) | {other:.1f}% |")
'
