"""The model of a training step on N machines, from the parts scripts/mpi-scaling.sh measured.

    python scripts/mpi-model.py OUT

One step of a fixed global batch of B rows, data-parallel over N machines like the one measured
(each takes B/N rows; a speed-up in brackets is the overlapped one):
  compute  C = B/m * t_mb, split evenly: C / N    (t_mb = step(2 micro-batches of m rows) - step(1))
  update   U = step(1) - t_mb, on every machine, not split
  reduce   R(N) = R(2) * 2(N-1)/N: a ring all-reduce's link carries 2(N-1)/N of the gradients,
           R(2) the measured all-reduce over two ranks (the faster of one tensor at a time and one
           buffer), so R(2) holds the link's latency as measured, not a switch's
  t(N)     = C/N + U + R(N)                       not overlapped (tinygpt today)
  t_o(N)   = C/N + U + max(R(N)/L, R(N) - (2/3)C/N)   each layer's all-reduce started as its
           backward ends (llm.c): the backward, about 2/3 of the compute, hides the reduce but for
           the last layer's (1/L of it)
  speed-up = t(1) / t(N), t(1) = C + U
What it leaves out: compute that does not split evenly over small per-machine batches, a reduce
that slows the compute it overlaps (both share the cores), and latency beyond the link measured.
"""
import json
import sys
from pathlib import Path

# (measured preset, its global batch in rows, its blocks): a machine takes global/N rows.
CASES = [
    ("baby", 12, 4),
    ("modern-64", 64, 4),
    ("135m", 8, 30),
    ("135m", 64, 30),
    ("135m-lora16", 8, 30),
    ("135m-lora16", 64, 30),
]
MACHINES = [2, 8, 64]


def load(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def main(out):
    steps = {}
    for r in load(Path(out) / "steps.jsonl"):
        steps[(r["name"], r["grad_accum"])] = r
    reduces = {}
    for r in load(Path(out) / "reduce.jsonl"):
        reduces[(r["name"], r["link"])] = r
    print("| preset, global batch | step on 1 machine | link | all-reduce, 2 ranks | "
          + " | ".join(f"N = {n}" for n in MACHINES) + " |")
    print("|---|---:|---|---:|" + "---:|" * len(MACHINES))
    for name, rows, layers in CASES:
        one_mb, two_mb = steps[(name, 1)], steps[(name, 2)]
        t1, t2 = one_mb["ms_per_iter"] / 1e3, two_mb["ms_per_iter"] / 1e3
        t_mb = t2 - t1
        update = t1 - t_mb
        compute = rows / one_mb["batch"] * t_mb
        one = compute + update
        for link in ["loopback", "10gbit", "1gbit"]:
            r = reduces.get((name, link))
            if r is None:
                continue
            r2 = min(r["per_tensor_s"], r["one_buffer_s"])
            cells = []
            for n in MACHINES:
                if n > rows:
                    cells.append("–")
                    continue
                reduce = r2 * 2 * (n - 1) / n
                plain = compute / n + update + reduce
                hidden = max(reduce / layers, reduce - (2 / 3) * compute / n)
                overlapped = compute / n + update + hidden
                cells.append(f"{one / plain:.2f}× ({one / overlapped:.2f}×)")
            mb = r["bytes"] / 1e6
            print(f"| {name}, {rows} × {one_mb['block']} | {one:.3f} s | {link} | "
                  f"{r2 * 1e3:.1f} ms ({mb:.1f} MB) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
