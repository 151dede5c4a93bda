#!/usr/bin/env python3
"""PyTorch's sampling speed for the GPT of the shared benchmark (torch_gpt.py) with a static
KV cache, eager and torch.compile'd: the reference beside `tinygpt bench`'s sample tok/s on the
same GPU.

The cache is gpt-fast's: keys and values of every layer in fixed `[batch, heads, block, d_head]`
buffers, each token written at its position in place, attention over all `block` rows
with the rows past the position masked, the next token drawn on the device (temperature 0.8,
the exponential-race form of a multinomial draw, which needs no host sync). Each token's id is
read to the host as it comes (`.item()`), as a streaming sampler must: one host read per token,
as tinygpt. With --compile the step is `torch.compile(mode="reduce-overhead", fullgraph=True)`:
Inductor's fused kernels replayed as one CUDA graph per token.

When a sequence reaches the block size the cache starts again at position 0 (a new sequence from
the last token), so every token is one cached step: this times the cached step, not nanoGPT's
sliding-window rebuild.

  python3 torch-sample.py --torch-gpt torch_gpt.py --device cuda --tokens 500 \\
      --n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --no-bias [--dtype bfloat16] [--compile]

Prints one JSON line: {"phase": "sample", "kv_cache": "static", "tokens_per_s": ..., ...}.
"""
import argparse
import importlib.util
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def load_torch_gpt(path):
    spec = importlib.util.spec_from_file_location("torch_gpt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CachedStep(nn.Module):
    """One token through `gpt` with static caches: idx [1, 1] at position pos [1] -> next id [1, 1]."""

    def __init__(self, gpt, n_head, block, dtype):
        super().__init__()
        self.gpt, self.h, self.block = gpt, n_head, block
        d = gpt.transformer.wte.weight.shape[1]
        shape = (len(gpt.transformer.h), 1, n_head, block, d // n_head)
        device = gpt.transformer.wte.weight.device
        self.register_buffer("k", torch.zeros(shape, device=device, dtype=dtype))
        self.register_buffer("v", torch.zeros(shape, device=device, dtype=dtype))

    def forward(self, idx, pos):
        t = self.gpt.transformer
        d = t.wte.weight.shape[1]
        x = t.wte(idx) + t.wpe(pos).view(1, 1, d)
        seen = (torch.arange(self.block, device=idx.device) <= pos).view(1, 1, 1, self.block)
        for layer, blk in enumerate(t.h):
            q, k, v = blk.attn.c_attn(blk.ln_1(x)).split(d, dim=2)
            q, k, v = (z.view(1, 1, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
            self.k[layer][:, :, pos] = k
            self.v[layer][:, :, pos] = v
            y = F.scaled_dot_product_attention(q, self.k[layer], self.v[layer], attn_mask=seen)
            x = x + blk.attn.c_proj(y.transpose(1, 2).reshape(1, 1, d))
            x = x + blk.mlp(blk.ln_2(x))
        logits = self.gpt.lm_head(t.ln_f(x))[:, -1, :].float()
        probs = F.softmax(logits / 0.8, dim=-1)
        race = torch.empty_like(probs).exponential_(1)
        return torch.argmax(probs / race, dim=-1, keepdim=True)


def sample(step, tokens, block, device):
    """`tokens` tokens from token 0, one host read each; returns the ids."""
    ids, token = [], 0
    for i in range(tokens):
        pos = torch.tensor([i % block], device=device)
        idx = torch.tensor([[token]], device=device)
        token = step(idx, pos).item()
        ids.append(token)
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--torch-gpt", default="torch_gpt.py", help="the shared benchmark's torch_gpt.py")
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=65)
    ap.add_argument("--no-bias", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()

    torch.manual_seed(1337)
    dtype = getattr(torch, a.dtype)
    gpt = load_torch_gpt(a.torch_gpt).GPT(a.vocab, a.block_size, a.n_layer, a.n_head, a.n_embd, 0.0, not a.no_bias)
    gpt = gpt.to(a.device, dtype).eval()
    step = CachedStep(gpt, a.n_head, a.block_size, dtype)
    if a.compile:
        step = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    with torch.no_grad():
        t0 = time.perf_counter()
        sample(step, a.tokens, a.block_size, a.device)  # warm-up: compiles, captures
        sync()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        sample(step, a.tokens, a.block_size, a.device)
        sync()
        dt = time.perf_counter() - t0
    print(json.dumps({
        "phase": "sample", "kv_cache": "static", "torch": torch.__version__, "device": a.device,
        "dtype": a.dtype, "compile": a.compile, "tokens": a.tokens,
        "params": sum(p.numel() for p in gpt.parameters()),
        "tokens_per_s": round(a.tokens / dt, 1), "first_pass_s": round(first, 2),
    }), flush=True)


if __name__ == "__main__":
    main()
