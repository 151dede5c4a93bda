#!/usr/bin/env python3
"""tinygpt's `modern` preset in PyTorch, and the speedrun communities' parts one flag each, to
see which parts cut the steps to a loss before they are written into tinygpt's engines.

Trains on a character corpus (the first 90% of the text; the rest is the validation split),
evaluates the loss over the whole validation split (every token predicted once, from windows
of `block` tokens, as `tinygpt eval` does) every `--eval-every` steps, and prints the first
step at which it is at most `--target`, one JSON line per seed. Steps only: the seconds are
tinygpt's, measured with the parts in its fused engine (docs/perf.md, "The record table").

    PYTHON scripts/parts-prototype.py input.txt --seeds 1337 1 2 --parts x0 bigram

The parts (modded-nanogpt's record history, nanochat's dev log):
  x0         the embedding fed into every block: x <- lambda_l x + mu_l x0 (learned, 1 and 0)
  bigram     an exact bigram embedding: a row per (previous, current) character, zero at first
  ve         value embeddings: a token's own row added to its values on alternate layers
  mtp        a second head predicting the token after next, its loss weighted down linearly
  zerohead   the head initialised at zero
and the training settings: --lr-embedding/--lr-head/--lr-scalars (multiples of --lr),
--schedule cosine|wsd with --decay-fraction, --steps (the schedule's length), --batch.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def rms(x, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope_tables(seq, d_head, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, d_head, 2).float() / d_head)
    angles = torch.outer(torch.arange(seq).float(), inv)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class Block(nn.Module):
    def __init__(self, c, heads, ve_vocab):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(c, 3 * c, bias=False)
        self.c_proj = nn.Linear(c, c, bias=False)
        self.c_fc = nn.Linear(c, 4 * c, bias=False)
        self.mlp_proj = nn.Linear(4 * c, c, bias=False)
        self.ve = nn.Embedding(ve_vocab, c) if ve_vocab else None

    def forward(self, x, tokens, cos, sin):
        b, t, c = x.shape
        d = c // self.heads
        q, k, v = self.c_attn(rms(x)).split(c, -1)
        if self.ve is not None:
            v = v + self.ve(tokens)
        q, k, v = (z.view(b, t, self.heads, d).transpose(1, 2) for z in (q, k, v))
        q, k = rms(q), rms(k)
        q, k = rotate(q, cos[:t], sin[:t]), rotate(k, cos[:t], sin[:t])
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.relu(self.c_fc(rms(x))).square())


class Gpt(nn.Module):
    def __init__(self, vocab, block, layers=4, heads=4, c=128, parts=()):
        super().__init__()
        self.parts, self.vocab = set(parts), vocab
        self.wte = nn.Embedding(vocab, c)
        self.bigram = nn.Embedding(vocab * vocab, c) if "bigram" in parts else None
        ve = lambda l: vocab if "ve" in parts and l % 2 == 0 else 0
        self.h = nn.ModuleList(Block(c, heads, ve(l)) for l in range(layers))
        self.lm_head = nn.Linear(c, vocab, bias=False)
        self.mtp_head = nn.Linear(c, vocab, bias=False) if "mtp" in parts else None
        self.x0 = nn.Parameter(torch.tensor([[1.0, 0.0]] * layers)) if "x0" in parts else None
        cos, sin = rope_tables(block, c // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name, p in self.named_parameters():
            zero = name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight")
            zero |= ".ve." in name or name.startswith("bigram")
            zero |= "zerohead" in parts and name.startswith(("lm_head", "mtp_head"))
            if name == "x0":
                continue
            nn.init.zeros_(p) if zero else nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx):
        x = self.wte(idx)
        if self.bigram is not None:
            pairs = idx[:, :-1] * self.vocab + idx[:, 1:]
            x = x + F.pad(self.bigram(pairs), (0, 0, 1, 0))
        x0 = x
        for l, block in enumerate(self.h):
            if self.x0 is not None:
                x = self.x0[l, 0] * x + self.x0[l, 1] * x0
            x = block(x, idx, self.cos, self.sin)
        h = rms(x)
        cap = lambda z: 15.0 * torch.tanh(z / 15.0)
        extra = cap(self.mtp_head(h)) if self.mtp_head is not None else None
        return cap(self.lm_head(h)), extra


def groups(model, args):
    """AdamW's groups: decay on 2-D weights; each group's learning rate a multiple of --lr."""
    named = dict(model.named_parameters())
    group = lambda name: (
        "embedding" if name.startswith(("wte", "bigram")) or ".ve." in name
        else "head" if name.startswith(("lm_head", "mtp_head"))
        else "scalars" if name == "x0" else "matrices")
    ratio = {"embedding": args.lr_embedding, "head": args.lr_head, "scalars": args.lr_scalars,
             "matrices": 1.0}
    out = {}
    for name, p in named.items():
        g, decay = group(name), p.dim() >= 2 and name != "x0"
        out.setdefault((g, decay), []).append(p)
    return [{"params": ps, "ratio": ratio[g], "weight_decay": args.weight_decay if decay else 0.0}
            for (g, decay), ps in out.items()]


def learning_rate(args, step):
    if step < args.warmup:
        return args.lr * (step + 1) / (args.warmup + 1)
    if step >= args.steps:
        return args.min_lr
    if args.schedule == "cosine":
        ratio = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (args.lr - args.min_lr)
    start = max(args.warmup, args.steps - round(args.decay_fraction * args.steps))
    if step < start:
        return args.lr
    return args.lr + (args.min_lr - args.lr) * (step - start) / max(1, args.steps - start)


@torch.no_grad()
def whole_val_loss(model, val, block):
    model.eval()
    n = (len(val) - 1 + block - 1) // block
    total, count = 0.0, 0
    for start in range(0, n, 64):
        xs, ys = [], []
        for w in range(start, min(n, start + 64)):
            a = w * block
            x = val[a:a + block]
            y = val[a + 1:a + block + 1]
            x = x[: len(y)]
            pad = block - len(x)
            xs.append(F.pad(x, (0, pad)))
            ys.append(F.pad(y, (0, pad), value=-1))
        logits, _ = model(torch.stack(xs))
        loss = F.cross_entropy(logits.flatten(0, 1), torch.stack(ys).flatten(), ignore_index=-1,
                               reduction="sum")
        total += loss.item()
        count += int((torch.stack(ys) >= 0).sum())
    model.train()
    return total / count


def run(args, seed, train, val, vocab):
    torch.manual_seed(seed)
    model = Gpt(vocab, args.block, parts=args.parts)
    param_groups = groups(model, args)
    optim = torch.optim.AdamW(param_groups, lr=args.lr, betas=(0.9, 0.99), eps=1e-8)
    gen = torch.Generator().manual_seed(seed)
    start = time.time()
    for step in range(1, args.max_steps + 1):
        lr = learning_rate(args, step - 1)
        for g in optim.param_groups:
            g["lr"] = lr * g["ratio"]
        ix = torch.randint(len(train) - args.block - 2, (args.batch,), generator=gen)
        x = torch.stack([train[i:i + args.block] for i in ix])
        y = torch.stack([train[i + 1:i + args.block + 1] for i in ix])
        logits, extra = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        if extra is not None:
            y2 = torch.stack([train[i + 2:i + args.block + 2] for i in ix])
            weight = args.mtp_weight * max(0.0, 1.0 - step / args.steps)
            loss = loss + weight * F.cross_entropy(extra.flatten(0, 1), y2.flatten())
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        if step % args.eval_every == 0:
            val_loss = whole_val_loss(model, val, args.block)
            if val_loss <= args.target:
                return {"seed": seed, "reached": step, "val": round(val_loss, 4),
                        "seconds": round(time.time() - start, 1)}
    return {"seed": seed, "reached": None, "val": round(val_loss, 4)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input")
    p.add_argument("--target", type=float, default=1.8983)
    p.add_argument("--seeds", type=int, nargs="+", default=[1337, 1, 2])
    p.add_argument("--parts", nargs="*", default=[],
                   choices=["x0", "bigram", "ve", "mtp", "zerohead"])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--lr-embedding", type=float, default=1.0)
    p.add_argument("--lr-head", type=float, default=1.0)
    p.add_argument("--lr-scalars", type=float, default=1.0)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--schedule", choices=["cosine", "wsd"], default="cosine")
    p.add_argument("--decay-fraction", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=2000, help="the schedule's length")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--mtp-weight", type=float, default=0.5)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--max-steps", type=int, default=1500)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    text = open(args.input, encoding="utf-8").read()
    chars = sorted(set(text))
    index = {ch: i for i, ch in enumerate(chars)}
    ids = torch.tensor([index[ch] for ch in text], dtype=torch.long)
    cut = int(len(ids) * 0.9)
    for seed in args.seeds:
        result = run(args, seed, ids[:cut], ids[cut:], len(chars))
        print(json.dumps({"parts": args.parts, **{k: v for k, v in vars(args).items()
                          if k not in ("input", "seeds", "parts", "threads")}, **result}),
              flush=True)


if __name__ == "__main__":
    main()
