//! A batch on the host ([`TokenBatch`]) and one thread's part of a step: its activation buffers, kept between calls, and the forward and
//! backward passes over them, layer by layer (the head's, a chunk of rows at a time, in
//! [`head`]).

mod head;

use super::overlap::BlockDone;
use crate::arch::{LoraTarget, Mlp};
use crate::cpu::block::{self, BlockActs, Ctx, Scratch, apply_mask};
use crate::cpu::dims::Dims;
use crate::cpu::frozen::dequantised;
use crate::cpu::kernels::attention::{self, Shape};
use crate::cpu::kernels::dropout::Rng;
use crate::cpu::kernels::norm::{self, Normed};
use crate::cpu::kernels::rope;
use crate::cpu::params::{Params, RowBlock};

/// A batch on the host: `inputs` and `targets` are `[batch, seq]` row-major; targets may be
/// [`IGNORE_INDEX`].
#[derive(Debug, Clone, Copy)]
pub struct TokenBatch<'a> {
    pub inputs: &'a [i64],
    pub targets: &'a [i64],
    pub batch: usize,
    pub seq: usize,
}

/// One thread's share of a batch.
pub(crate) struct Job<'a> {
    pub work: &'a mut Workspace,
    /// Its sequences: `seqs` of them from index `first` of `batch`.
    pub first: usize,
    pub seqs: usize,
    pub batch: &'a TokenBatch<'a>,
    /// Told of each block's final gradient as the backward leaves it (the overlapped sum over
    /// ranks, `overlap.rs`).
    pub block_done: Option<BlockDone<'a>>,
}

impl Job<'_> {
    /// Forward, loss and (with `grad_scale`) backward over the share; returns its summed loss.
    pub(crate) fn run(
        self,
        dims: Dims,
        w: &Params,
        grad_scale: Option<f32>,
        dropout: Option<u64>,
    ) -> f64 {
        let seq = self.batch.seq;
        let rows = self.first * seq..(self.first + self.seqs) * seq;
        let inputs = &self.batch.inputs[rows.clone()];
        let targets = &self.batch.targets[rows];
        let work = self.work;
        let masks = dropout.map(|seed| Masks {
            seed,
            first: self.first,
            p: dims.dropout,
            lora: w.lora_dropout(),
        });
        let drop = masks.map_or((false, false), |m| (m.p > 0.0, m.lora > 0.0));
        work.prepare(dims, w, (self.seqs, seq), grad_scale.is_some(), drop);
        work.dropout = masks;
        if let Some(masks) = work.dropout {
            masks.fill(&mut work.emb_mask, 0, self.seqs);
        }
        work.forward(w, inputs, &dims);
        let parts = head::Head {
            ln_f: &work.ln_f,
            width: work.width,
            logits: &mut work.logits,
            capped: &mut work.capped,
            d_ln_f: &mut work.scratch.d_branch,
            grads: &mut work.grads,
        };
        let loss = head::head(parts, w, &dims, targets, grad_scale);
        if grad_scale.is_some() {
            work.backward(w, inputs, &dims, self.block_done);
        }
        loss
    }
}

/// Where a step's dropout masks come from: each sequence's masks depend only on the seed, its
/// index in the whole batch and the site (0 the embedding, then three a block; the LoRA
/// adapters' inputs from [`LORA_SITES`], four a block), so a block's can be drawn again when
/// its forward is recomputed.
#[derive(Debug, Clone, Copy)]
struct Masks {
    seed: u64,
    /// The index of this thread's first sequence in the batch.
    first: usize,
    /// The model's dropout, and the adapters' (`[lora] dropout`).
    p: f32,
    lora: f32,
}

/// The first site of the adapters' masks: past any model's own sites.
const LORA_SITES: usize = 1 << 32;

impl Masks {
    /// `mask`'s scales at `site`, per sequence (numbered from `first` in the whole batch), with
    /// the model's dropout.
    fn fill(self, mask: &mut [f32], site: usize, seqs: usize) {
        self.fill_with(mask, site, seqs, self.p);
    }

    fn fill_with(self, mask: &mut [f32], site: usize, seqs: usize, p: f32) {
        if mask.is_empty() {
            return;
        }
        let per_seq = mask.len() / seqs;
        for (s, chunk) in mask.chunks_exact_mut(per_seq).enumerate() {
            Rng::new(self.seed, (self.first + s) as u64, site as u64).fill_mask(chunk, p);
        }
    }
}

/// The activations block `l` is computed in, its dropout masks drawn (sites `1 + 3l` to
/// `3 + 3l`) when the step drops out: its own, or with checkpointing the one held.
fn block_acts(
    blocks: &mut [BlockActs],
    checkpointing: bool,
    dropout: Option<Masks>,
    seqs: usize,
    l: usize,
) -> &mut BlockActs {
    let a = match checkpointing {
        true => &mut blocks[0],
        false => &mut blocks[l],
    };
    if let Some(masks) = dropout {
        let sites = [&mut a.att_mask, &mut a.attn_mask, &mut a.mlp_mask];
        for (k, mask) in sites.into_iter().enumerate() {
            masks.fill(mask, 1 + 3 * l + k, seqs);
        }
        for (t, mask) in a.adapters.mask.iter_mut().enumerate() {
            masks.fill_with(mask, LORA_SITES + 4 * l + t, seqs, masks.lora);
        }
    }
    a
}

/// Buffers of one thread, reused from call to call (resizing keeps their allocations).
#[derive(Debug, Default)]
pub(crate) struct Workspace {
    /// Activation checkpointing: one block's activations are held, not every block's; the
    /// backward recomputes each block's forward from its input (kept in `resid`) first.
    pub checkpointing: bool,
    dropout: Option<Masks>,
    seqs: usize,
    seq: usize,
    width: usize,
    heads: usize,
    kv_heads: usize,
    /// Rotary positions' tables for the model's context (empty without them).
    rope: rope::Tables,
    /// `resid[0]` is the embedding, `resid[l + 1]` block `l`'s output; `[rows, width]` each.
    resid: Vec<Vec<f32>>,
    emb_mask: Vec<f32>,
    /// Each block's activations, or with checkpointing the one block's being computed.
    blocks: Vec<BlockActs>,
    ln_f: Vec<f32>,
    ln_f_mean: Vec<f32>,
    ln_f_rstd: Vec<f32>,
    /// One chunk's logits `[HEAD_ROWS, vocab]`, then the loss's gradient ([`head`]).
    logits: Vec<f32>,
    /// With a soft-cap: the chunk's `tanh(raw logits / cap)`, `[HEAD_ROWS, vocab]`.
    capped: Vec<f32>,
    /// Backward: the residual gradient `[rows, width]`, and the blocks' scratch (whose
    /// attention maps the forward uses too).
    d_resid: Vec<f32>,
    scratch: Scratch,
    /// With a base held quantised (`[lora] base = "q8_0"` or `"q4_k"`): the block being
    /// computed's matrices dequantised, as f32 rows.
    base: RowBlock,
    pub grads: Params,
    /// Whether `grads` is known to be zero and shaped like the weights (set by the caller that
    /// hands it the step's sum), so the next step need not clear it.
    pub grads_zero: bool,
}

fn size(buf: &mut Vec<f32>, len: usize) {
    buf.resize(len, 0.0);
}

impl Workspace {
    /// Sizes every buffer for `seqs` sequences of `seq` tokens; `drop`: whether the step
    /// draws the model's dropout masks and the adapters'.
    fn prepare(
        &mut self,
        d: Dims,
        w: &Params,
        (seqs, seq): (usize, usize),
        grad: bool,
        (drop, lora_drop): (bool, bool),
    ) {
        let (rows, c) = (seqs * seq, d.width);
        self.seqs = seqs;
        self.seq = seq;
        self.width = c;
        self.heads = d.heads;
        self.kv_heads = d.kv_heads;
        if let Some(base) = d.rope
            && self.rope.is_empty()
        {
            self.rope = rope::Tables::new(d.block_size, d.d_head(), base);
        }
        self.resid.resize_with(w.blocks.len() + 1, Vec::new);
        self.resid.iter_mut().for_each(|r| size(r, rows * c));
        let held = match self.checkpointing {
            true => 1.min(w.blocks.len()),
            false => w.blocks.len(),
        };
        self.blocks.truncate(held);
        self.blocks.resize_with(held, Default::default);
        size(&mut self.emb_mask, if drop { rows * c } else { 0 });
        let att = seqs * d.heads * seq * seq;
        for a in &mut self.blocks {
            a.resize(rows, &d, att, drop);
            for t in LoraTarget::all() {
                let adapted = lora_drop && w.blocks.first().is_some_and(|b| b.lora.has(t));
                size(
                    &mut a.adapters.mask[t as usize],
                    rows * lora_input(&d, t) * usize::from(adapted),
                );
            }
        }
        size(&mut self.ln_f, rows * c);
        size(&mut self.ln_f_mean, rows);
        size(&mut self.ln_f_rstd, rows);
        let logits = head::logits_floats(rows, d.vocab);
        size(&mut self.logits, logits);
        size(&mut self.capped, logits * usize::from(d.softcap > 0.0));
        size(&mut self.scratch.maps, 2 * seq * seq);
        if grad {
            size(&mut self.d_resid, rows * c);
            size(&mut self.scratch.d_branch, rows * c);
            // The MLP's activation gradient, and for SwiGLU its pre-activation's beside it.
            let mlp = match d.fc_width == d.hidden {
                true => d.hidden,
                false => d.hidden + d.fc_width,
            };
            size(&mut self.scratch.d_wide, rows * mlp.max(c));
            size(&mut self.scratch.d_qkv, rows * d.qkv_width());
            // Handed the step's zero sum (the first thread's share): zero already.
            if !std::mem::take(&mut self.grads_zero) {
                self.grads.zero_like(w);
            }
        }
    }

    /// Floats of activations held for the backward pass: the residual stream, the blocks'
    /// and the head's (not the gradients' buffers).
    pub(crate) fn activation_floats(&self) -> usize {
        let stream: usize = self.resid.iter().map(Vec::len).sum();
        let blocks: usize = self.blocks.iter().map(BlockActs::floats).sum();
        let head = self.ln_f.len() + self.logits.len() + self.capped.len() + self.emb_mask.len();
        stream + blocks + head
    }

    /// Floats in every buffer of this thread (activations and backward scratch, not the
    /// gradients' buffer or the rotary tables): what [`floats_for`] predicts.
    pub(crate) fn floats(&self) -> usize {
        let s = &self.scratch;
        let scratch = [&s.d_branch, &s.d_wide, &s.d_qkv, &s.maps, &s.lora_t];
        self.activation_floats()
            + self.ln_f_mean.len()
            + self.ln_f_rstd.len()
            + self.d_resid.len()
            + scratch.iter().map(|b| b.len()).sum::<usize>()
            + self.base.bytes() / 4
    }

    /// Frees every buffer (the next step sizes them again), keeping its settings: room for
    /// what is lent out between steps.
    pub(crate) fn release(&mut self) {
        *self = Self {
            checkpointing: self.checkpointing,
            ..Self::default()
        };
    }

    fn shape(&self) -> Shape {
        Shape {
            seqs: self.seqs,
            seq: self.seq,
            width: self.width,
            heads: self.heads,
            kv_heads: self.kv_heads,
        }
    }

    fn forward(&mut self, w: &Params, inputs: &[i64], d: &Dims) {
        self.forward_seeing(w, inputs, d, |_, _| {});
    }

    /// The attention weights of one sequence `inputs` under `w`, without dropout:
    /// `maps[layer][head]`, each `[seq, seq]` row-major (rows queries, columns keys; zero
    /// above the diagonal). A forward through the blocks; the head is not computed.
    pub(crate) fn attention_maps(
        &mut self,
        d: Dims,
        w: &Params,
        inputs: &[i64],
    ) -> Vec<Vec<Vec<f32>>> {
        let seq = inputs.len();
        self.prepare(d, w, (1, seq), false, (false, false));
        self.dropout = None;
        let mut maps = Vec::with_capacity(w.blocks.len());
        self.forward_seeing(w, inputs, &d, |_, a| {
            let heads = a.att.chunks_exact(seq * seq).take(d.heads);
            maps.push(heads.map(<[f32]>::to_vec).collect());
        });
        maps
    }

    /// The forward to the final norm's output, `seen` handed each block's activations as its
    /// forward ends (with checkpointing, before the next block's overwrite them).
    fn forward_seeing(
        &mut self,
        w: &Params,
        inputs: &[i64],
        d: &Dims,
        mut seen: impl FnMut(usize, &BlockActs),
    ) {
        let (c, seq, shape) = (self.width, self.seq, self.shape());
        // Token (+ position, + bigram) embeddings.
        for (r, (row, &tok)) in self.resid[0].chunks_exact_mut(c).zip(inputs).enumerate() {
            let at = (tok as usize, r % seq, pair(d, inputs, r, seq));
            w.embed(row, at, Default::default());
        }
        apply_mask(&mut self.resid[0], &self.emb_mask);
        let ctx = training_ctx(d, &self.rope, seq);
        let maps = &mut self.scratch.maps;
        let (held, dropout, seqs) = (self.checkpointing, self.dropout, self.seqs);
        for (l, p) in w.blocks.iter().enumerate() {
            let a = block_acts(&mut self.blocks, held, dropout, seqs, l);
            let (before, after) = self.resid.split_at_mut(l + 1);
            let matrices = dequantised(p, &mut self.base);
            let ctx = Ctx { matrices, ..ctx };
            block::forward(p, a, &before[l], &mut after[0], ctx, |h| {
                attention::forward(h.y, h.att, h.qkv, h.att_mask, maps, shape);
            });
            seen(l, a);
        }
        let x = self.resid.last().expect("embedding at least");
        let ln_f = Normed {
            out: &mut self.ln_f,
            mean: &mut self.ln_f_mean,
            rstd: &mut self.ln_f_rstd,
        };
        let (gamma, beta) = (w.ln_f_gamma.get(), w.ln_f_beta.get());
        norm::forward(d.norm, ln_f, x, gamma, beta, d.epsilon);
    }

    /// Gradients of every parameter into `self.grads`, from the loss gradient with respect to
    /// the final norm's output in `self.scratch.d_branch` ([`head::head`] put it there);
    /// `block_done` is handed each block's as it is complete (and may take its buffers).
    fn backward(
        &mut self,
        w: &Params,
        inputs: &[i64],
        d: &Dims,
        block_done: Option<BlockDone<'_>>,
    ) {
        let (seq, shape) = (self.seq, self.shape());
        self.final_norm_backward(w, d);
        let ctx = training_ctx(d, &self.rope, seq);
        let (held, dropout, seqs) = (self.checkpointing, self.dropout, self.seqs);
        let g = &mut self.grads;
        for l in (0..w.blocks.len()).rev() {
            let (p, gb) = (&w.blocks[l], &mut g.blocks[l]);
            let a = block_acts(&mut self.blocks, held, dropout, seqs, l);
            let (before, after) = self.resid.split_at_mut(l + 1);
            let x = &before[l];
            let matrices = dequantised(p, &mut self.base);
            let ctx = Ctx { matrices, ..ctx };
            if held {
                // The same forward on the same input, masks and weights: the same
                // activations, bit for bit (the output it rewrites is already used).
                let maps = &mut self.scratch.maps;
                block::forward(p, a, x, &mut after[0], ctx, |h| {
                    attention::forward(h.y, h.att, h.qkv, h.att_mask, maps, shape);
                });
            }
            block::backward(
                p,
                gb,
                a,
                x,
                &mut self.d_resid,
                &mut self.scratch,
                shape,
                ctx,
            );
            if let Some(done) = block_done {
                done.done(l, gb);
            }
        }
        apply_mask(&mut self.d_resid, &self.emb_mask);
        let c = self.width;
        add_embedding_gradients(&mut self.grads, &self.d_resid, inputs, d, (seq, c));
    }

    /// The final norm's backward: `self.d_resid` gets the gradient of the last block's output
    /// from `self.scratch.d_branch`, the norm's own gradients added into `self.grads`.
    fn final_norm_backward(&mut self, w: &Params, d: &Dims) {
        let g = &mut self.grads;
        self.d_resid.fill(0.0);
        let x = self.resid.last().expect("embedding at least");
        let stats = (&self.ln_f_mean[..], &self.ln_f_rstd[..]);
        let (dgamma, dbeta) = (g.ln_f_gamma.get_mut(), g.ln_f_beta.get_mut());
        let (dout, gain) = (&self.scratch.d_branch, w.ln_f_gamma.get());
        let d_resid = &mut self.d_resid;
        norm::backward(d.norm, d_resid, dgamma, dbeta, dout, x, stats, gain);
    }
}

/// How a step's blocks compute: sequences of `seq` rows from position 0, training's own
/// layout of the matrices (a quantised base's, dequantised, set in block by block), f32
/// products, no helpers.
fn training_ctx<'a>(d: &'a Dims, rope: &'a rope::Tables, seq: usize) -> Ctx<'a> {
    Ctx {
        dims: d,
        rope,
        first: 0,
        period: seq,
        streams: None,
        matrices: None,
        rows_alone: false,
        integer: false,
        helpers: None,
    }
}

/// The embeddings' gradients from `d_resid`, the gradient of the embedded rows: each row's
/// into its token's row of `wte`, its position's of `wpe` and its pair's of the bigram table.
/// Frozen embeddings (LoRA's base) have no gradients, and a model without a position or
/// bigram table none of its own.
fn add_embedding_gradients(
    g: &mut Params,
    d_resid: &[f32],
    inputs: &[i64],
    d: &Dims,
    (seq, c): (usize, usize),
) {
    let add = |table: &mut [f32], row: usize, dx: &[f32]| {
        let row = &mut table[row * c..(row + 1) * c];
        row.iter_mut().zip(dx).for_each(|(g, d)| *g += d);
    };
    for (r, (dx, &tok)) in d_resid.chunks_exact(c).zip(inputs).enumerate() {
        if let Some(wte) = g.wte.get_mut() {
            add(wte, tok as usize, dx);
        }
        if let Some(wpe) = g.wpe.get_mut() {
            add(wpe, r % seq, dx);
        }
        if let Some(bigram) = g.bigram.get_mut() {
            add(bigram, pair(d, inputs, r, seq), dx);
        }
    }
}

/// Row `r`'s pair in the bigram table: its token after the one before it in its sequence
/// (sequences of `seq` rows; the first of each pairs with none).
fn pair(d: &Dims, inputs: &[i64], r: usize, seq: usize) -> usize {
    let before = (!r.is_multiple_of(seq)).then(|| inputs[r - 1] as usize);
    d.pair(before, inputs[r] as usize)
}

/// Columns of the input of `target`'s matrix: what its adapter's dropout masks.
fn lora_input(d: &Dims, target: LoraTarget) -> usize {
    match target {
        LoraTarget::Qkv | LoraTarget::AttnProj | LoraTarget::Fc => d.width,
        LoraTarget::MlpProj => d.hidden,
    }
}

/// What one thread's step sizes: `seqs` sequences of `seq` tokens, whether it keeps one
/// block's activations or every block's, computes gradients and draws dropout masks, the
/// rank of the adapters on each [`LoraTarget`] (0 = none), whether their inputs are dropped
/// out, and what of a block's base is dequantised for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizing {
    pub layers: usize,
    pub seqs: usize,
    pub seq: usize,
    pub checkpointing: bool,
    pub grad: bool,
    pub dropout: bool,
    pub lora_ranks: [usize; 4],
    pub lora_dropout: bool,
    /// Floats of one block's matrices held quantised (`[lora] base = "q8_0"` or `"q4_k"`),
    /// which a step dequantises a block at a time.
    pub base_rows: usize,
}

/// Floats a thread's buffers hold after a step of `s` on a model of `d`, as `prepare`, the
/// blocks and the LoRA kernels size them ([`Workspace::floats`] after the step): the memory
/// estimate's activations, computed without allocating.
pub(crate) fn floats_for(d: &Dims, s: Sizing) -> usize {
    let (rows, c) = (s.seqs * s.seq, d.width);
    let att = s.seqs * d.heads * s.seq * s.seq;
    let drop = |n: usize| if s.dropout { n } else { 0 };
    let qk = if d.qk_norm { rows * d.qk_width() } else { 0 };
    let mlp_mask = if d.mlp == Mlp::None {
        0
    } else {
        drop(rows * c)
    };
    let xa: usize = s.lora_ranks.iter().map(|r| rows * r).sum();
    let lora_masks: usize = LoraTarget::all()
        .filter(|&t| s.lora_dropout && s.lora_ranks[t as usize] > 0)
        .map(|t| rows * lora_input(d, t))
        .sum();
    // `BlockActs::resize`: four `[rows, width]`, four per-row statistics, QK-norm's, q/k/v, the
    // attention weights, the MLP's two, the masks; and each adapter's `x · A`.
    let block = 4 * rows * c
        + 4 * rows
        + qk
        + qk / d.d_head()
        + rows * d.qkv_width()
        + att
        + rows * d.fc_width
        + rows * d.hidden
        + drop(att)
        + drop(rows * c)
        + mlp_mask
        + xa
        + lora_masks;
    let held = if s.checkpointing {
        s.layers.min(1)
    } else {
        s.layers
    };
    // One chunk of the head's logits, and of the soft cap's values beside them.
    let logits = head::logits_floats(rows, d.vocab);
    let softcap = logits * usize::from(d.softcap > 0.0);
    let forward = (s.layers + 1) * rows * c
        + drop(rows * c)
        + held * block
        + rows * c
        + 2 * rows
        + logits
        + softcap
        + 2 * s.seq * s.seq
        + s.base_rows;
    if !s.grad {
        return forward;
    }
    let wide = match d.fc_width == d.hidden {
        true => d.hidden,
        false => d.hidden + d.fc_width,
    };
    let rank = s.lora_ranks.iter().copied().max().unwrap_or(0);
    forward + 2 * rows * c + rows * wide.max(c) + rows * d.qkv_width() + rows * rank
}
