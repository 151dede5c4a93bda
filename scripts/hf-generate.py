"""transformers' greedy generation speed on the CPU (f32, 2 threads, KV cache): 100 tokens after
"ROMEO:", after a warm-up. The figure docs/interop.md puts beside `tinygpt generate`.

    python scripts/hf-generate.py MODEL_DIR      # needs torch, transformers
"""
import sys, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
torch.set_num_threads(2)
d = sys.argv[1]
t0 = time.time()
m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
tok = AutoTokenizer.from_pretrained(d)
load = time.time() - t0
ids = torch.tensor([tok("ROMEO:")["input_ids"]])
with torch.no_grad():
    m.generate(ids, max_new_tokens=5, do_sample=False, min_new_tokens=5)  # warm-up
    t0 = time.time()
    out = m.generate(ids, max_new_tokens=100, min_new_tokens=100, do_sample=False)
    dt = time.time() - t0
n = out.shape[1] - ids.shape[1]
print(f"load {load:.1f}s, {n} tokens in {dt:.2f}s: {n/dt:.1f} tok/s, torch {torch.__version__}")
