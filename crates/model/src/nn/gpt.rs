//! [`Gpt`]: embeddings, blocks, final norm, LM head.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::nn::{Dropout, DropoutConfig, Embedding, Initializer, Linear};
use burn::tensor::module::linear as linear_op;
use burn::tensor::{Bool, DType, Device, FloatDType, Int, Tensor};
use tinygpt_attention::{AttentionKernel, DecodeProduct, Pass, burn_product};

use crate::arch::Position;
use crate::arch::{BaseWeights, GptConfig, TrainedPart};
use crate::error::{GptConfigError, ModelError};
use crate::gpu::{Kernels, rows};
use crate::nn::block::{Block, linear, norm};
use crate::nn::decoding::Decoding;
use crate::nn::norm::Normalization;

/// The language model [`GptConfig`] describes (nanoGPT's `GPT`, in whichever parts the config
/// names).
#[derive(Module, Debug)]
pub struct Gpt {
    /// Token embedding `[vocab_size, n_embd]`; also the LM head when tied.
    pub wte: Embedding,
    /// Learned position embedding `[block_size, n_embd]` (`position = "learned"`).
    pub wpe: Option<Embedding>,
    /// The bigram table `[(vocab_size + 1)·vocab_size, n_embd]` (`bigram = true`): the row of
    /// each token's pair with the one before it, added to its embedding.
    pub bigram: Option<Embedding>,
    pub drop: Dropout,
    pub h: Vec<Block>,
    /// The norm before the head.
    pub ln_f: Option<Normalization>,
    /// Untied LM head `[n_embd, vocab_size]`, no bias; `None` when tied to `wte`.
    pub lm_head: Option<Linear>,
    /// The architecture this model was built from: what the fused CPU engine checks before it
    /// runs it, and what export writes. Burn's record does not hold it, so it is set once, by
    /// [`GptConfig::init`], and read through [`Gpt::config`]; a record of another architecture
    /// loaded into the model is caught by [`Gpt::check_config`].
    #[module(skip)]
    config: GptConfig,
    /// Which kernels the norms, the attention, the loss and the trainer's AdamW run, and how
    /// the decoders decode: decided once, from the device, by [`GptConfig::init`]
    /// ([`Kernels::for_device`]), or by the caller ([`Gpt::with_kernels`]); read through
    /// [`Gpt::kernels`].
    #[module(skip)]
    kernels: Kernels,
    /// How it decodes on a GPU where several ways give the same tokens ([`Decoding`]; the
    /// fastest measured unless the caller chose otherwise, [`Gpt::with_decoding`]).
    #[module(skip)]
    decoding: Decoding,
    /// The dropout on the LoRA adapters' inputs while training (`[lora] dropout`; 0 without
    /// adapters), set by [`Gpt::with_lora`] and read through [`Gpt::lora_dropout`].
    #[module(skip)]
    pub(crate) lora_dropout: f64,
    /// How the frozen base's matrices are held while adapters train (`[lora] base`), set by
    /// [`Gpt::with_lora`] and read through [`Gpt::lora_base`].
    #[module(skip)]
    pub(crate) lora_base: BaseWeights,
    /// The parts of the base trained in full beside the adapters (`[lora] also_train`), set by
    /// [`Gpt::with_lora`] and read through [`Gpt::lora_also_train`].
    #[module(skip)]
    pub(crate) lora_also_train: Vec<TrainedPart>,
}

impl GptConfig {
    /// Validates the config and creates the model on `device`: weights ~ N(0, 0.02), the
    /// projections onto the residual stream as `proj_init` says (GPT-2's `0.02/√(2·n_layer)`,
    /// or zero), biases 0, norms' gains 1; running the device's [`Kernels`]
    /// ([`Kernels::for_device`]).
    pub fn init(&self, device: &Device) -> Result<Gpt, GptConfigError> {
        self.init_with_attention(device, AttentionKernel::Auto)
    }

    /// [`init`](Self::init), every block's attention computed by `kernel` (the same numbers;
    /// see [`AttentionKernel`]). How, not what: it is the run's choice
    /// (`train.attention_kernel`), not the architecture's, fixed when the model is built.
    pub fn init_with_attention(
        &self,
        device: &Device,
        kernel: AttentionKernel,
    ) -> Result<Gpt, GptConfigError> {
        self.validate()?;
        if self.vocab_size == 0 {
            return Err(GptConfigError::Zero { name: "vocab_size" });
        }
        Gpt::init(self, device, kernel)
    }
}

impl Gpt {
    pub(crate) fn init(
        config: &GptConfig,
        device: &Device,
        kernel: AttentionKernel,
    ) -> Result<Self, GptConfigError> {
        let embedding = |n: usize| Embedding {
            weight: Initializer::Normal {
                mean: 0.0,
                std: 0.02,
            }
            .init([n, config.n_embd], device),
        };
        let kernels = Kernels::for_device(device);
        let h = (0..config.n_layer)
            .map(|_| Block::init(config, device, kernels, kernel))
            .collect::<Result<_, _>>()?;
        let model = Self {
            wte: embedding(config.vocab_size),
            wpe: match config.position {
                Position::Learned => Some(embedding(config.block_size)),
                Position::Rope | Position::None => None,
            },
            // At zero: a pair adds nothing until training teaches it (modded-nanogpt's).
            bigram: config.bigram.then(|| Embedding {
                weight: Initializer::Zeros.init([config.bigram_rows(), config.n_embd], device),
            }),
            drop: DropoutConfig::new(config.dropout).init(),
            h,
            ln_f: Normalization::init(config, device, kernels),
            lm_head: (!config.tie_embeddings)
                .then(|| linear(config.n_embd, config.vocab_size, 0.02, false, device)),
            config: config.clone(),
            kernels,
            decoding: Decoding::default(),
            lora_dropout: 0.0,
            lora_base: BaseWeights::F32,
            lora_also_train: Vec::new(),
        };
        Ok(model.with_kernels(kernels))
    }

    /// This model running `kernels` (the same numbers to float rounding): for a caller that
    /// decides otherwise than [`Kernels::for_device`], e.g. to compare the two, or that moved
    /// the model to another device with Burn's `to_device` (a moved model keeps the kernels of
    /// the device it was built on: `with_kernels(Kernels::for_device(device))`).
    pub fn with_kernels(mut self, kernels: Kernels) -> Self {
        self.kernels = kernels;
        let norms = self.h.iter_mut().flat_map(|b| [&mut b.ln_1, &mut b.ln_2]);
        for norm in norms.chain([&mut self.ln_f]).flatten() {
            norm.set_kernels(kernels);
        }
        self.with_products()
    }

    /// The kernels this model runs.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// This model decoding as `decoding` says (on a GPU; the same tokens every way).
    pub fn with_decoding(mut self, decoding: Decoding) -> Self {
        self.decoding = decoding;
        self.with_products()
    }

    /// How this model decodes on a GPU.
    pub fn decoding(&self) -> Decoding {
        self.decoding
    }

    /// Whether its products of a few rows run the rows kernel ([`rows`]): on a GPU, unless its
    /// decoding turned it off.
    fn rows_kernel(&self) -> bool {
        self.kernels == Kernels::Cube && self.decoding.rows_kernel
    }

    /// Its layers' [`DecodeProduct`] and attention kernels made to agree with its kernels and
    /// decoding: the one place that hands them down.
    fn with_products(mut self) -> Self {
        let product: DecodeProduct = match self.rows_kernel() {
            true => rows::linear::<3>,
            false => burn_product,
        };
        for block in &mut self.h {
            let attn = block.attn.clone().with_kernels(self.kernels);
            block.attn = attn.with_decode_product(product);
            if let Some(mlp) = &mut block.mlp {
                mlp.product = product;
            }
        }
        self
    }

    /// A copy of this model whose parameters are new buffers, written by the calling thread.
    ///
    /// On CUDA each thread issues its work on a stream of its own, and a decode step recorded
    /// as a graph on one thread cannot read buffers that another thread's stream wrote: the
    /// wait for that stream inside the recording invalidates it
    /// (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, met by `serve`, whose worker decoded on the
    /// weights the main thread loaded, and so ran its step launch by launch). A thread that
    /// records its steps decodes on a copy of its own. Costs one read and one write of the
    /// weights.
    pub fn copied_here(&self) -> Gpt {
        struct Copy;
        impl ModuleMapper for Copy {
            fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
                let (id, value, mapper) = param.consume();
                // In its own dtype: a bf16 decoder's matrices stay bf16.
                let (device, dtype) = (value.device(), value.dtype());
                let copy = Tensor::from_data(value.into_data(), (&device, dtype));
                Param::from_mapped_value(id, copy, mapper)
            }
        }
        self.clone().map(&mut Copy)
    }

    /// The architecture this model was built from.
    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// Number of distinct tokens.
    pub fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    /// The context length.
    pub fn block_size(&self) -> usize {
        self.config.block_size
    }

    /// Next-token logits: `tokens [batch, seq] Int -> [batch, seq, vocab_size]`.
    ///
    /// Token ids must be in `0..vocab_size`: check ids that do not come from the model's own
    /// tokenizer with [`check_tokens`](Self::check_tokens) on the host first. The forward pass
    /// itself never reads back from the device, so a GPU step does not stall on it.
    pub fn forward(&self, tokens: Tensor<2, Int>, pass: Pass) -> Result<Tensor<3>, ModelError> {
        self.forward_padded(tokens, None, pass)
    }

    /// [`forward`](Self::forward) with a key-padding mask `[batch, seq]` (`true` = padding).
    pub fn forward_padded(
        &self,
        tokens: Tensor<2, Int>,
        key_padding: Option<Tensor<2, Bool>>,
        pass: Pass,
    ) -> Result<Tensor<3>, ModelError> {
        let pairs = self.window_pairs(&tokens);
        let mut x = self.embed(tokens, pairs, 0, pass)?;
        for block in &self.h {
            x = block.forward(x, key_padding.clone(), pass)?;
        }
        Ok(self.head(x))
    }

    /// Logits and every layer's attention weights (`[batch, heads, seq, seq]` each), computed by
    /// the same attention code that trains.
    pub fn forward_with_attention(
        &self,
        tokens: Tensor<2, Int>,
    ) -> Result<(Tensor<3>, Vec<Tensor<4>>), ModelError> {
        let pairs = self.window_pairs(&tokens);
        let mut x = self.embed(tokens, pairs, 0, Pass::Infer)?;
        let mut maps = Vec::with_capacity(self.h.len());
        for block in &self.h {
            let (y, weights) = block.forward_with_weights(x)?;
            x = y;
            maps.push(weights);
        }
        Ok((self.head(x), maps))
    }

    /// Token + position (+ bigram) embeddings for tokens at positions `past..past + seq`,
    /// their pairs in the bigram table `pairs` (`[batch, seq]`, with one).
    pub(crate) fn embed(
        &self,
        tokens: Tensor<2, Int>,
        pairs: Option<Tensor<2, Int>>,
        past: usize,
        pass: Pass,
    ) -> Result<Tensor<3>, ModelError> {
        let seq = tokens.dims()[1];
        if past + seq > self.block_size() {
            return Err(tinygpt_attention::AttentionError::SequenceTooLong {
                len: past + seq,
                max: self.block_size(),
            }
            .into());
        }
        let device = tokens.device();
        let positions =
            Tensor::<1, Int>::arange(past as i64..(past + seq) as i64, &device).reshape([1, seq]);
        self.embed_at(tokens, positions, pairs, pass)
    }

    /// Token + position (+ bigram) embeddings of `tokens` `[batch, seq]` at `positions`
    /// (`[batch, seq]`, or `[1, seq]` for every sequence alike): `[batch, seq, n_embd]`. With a
    /// bigram table, `pairs` `[batch, seq]` are the tokens' rows of it; without them such a
    /// model cannot embed.
    pub(crate) fn embed_at(
        &self,
        tokens: Tensor<2, Int>,
        positions: Tensor<2, Int>,
        pairs: Option<Tensor<2, Int>>,
        pass: Pass,
    ) -> Result<Tensor<3>, ModelError> {
        let [batch, seq] = tokens.dims();
        let n_embd = self.wte.weight.dims()[1];
        let x = self.embed_tokens(tokens, pass);
        // Rotary positions enter inside attention, not here.
        let x = match (&self.wpe, self.config.position) {
            (Some(wpe), Position::Learned) => {
                x + wpe.forward(positions).expand([batch, seq, n_embd])
            }
            (_, Position::Learned | Position::Rope | Position::None) => x,
        };
        let x = match (&self.bigram, pairs) {
            (Some(bigram), Some(pairs)) => x + bigram.forward(pairs),
            (Some(_), None) => return Err(ModelError::BigramPairs),
            (None, _) => x,
        };
        Ok(pass.dropout(&self.drop, x))
    }

    /// The bigram table's rows of `tokens` `[batch, seq]` as a training window sees them: each
    /// token after the one before it, the first after none ([`GptConfig::bigram_pair`]).
    /// `None` without a table.
    pub(crate) fn window_pairs(&self, tokens: &Tensor<2, Int>) -> Option<Tensor<2, Int>> {
        self.bigram.as_ref()?;
        let [batch, seq] = tokens.dims();
        let vocab = self.vocab_size() as i64;
        let none = Tensor::<2, Int>::full([batch, 1], vocab, &tokens.device());
        let before = match seq {
            1 => none,
            _ => Tensor::cat(vec![none, tokens.clone().narrow(1, 0, seq - 1)], 1),
        };
        Some(before.mul_scalar(vocab) + tokens.clone())
    }

    /// The token embeddings of `tokens` (`[batch, seq]`): `[batch, seq, n_embd]`. Training on a
    /// GPU with a small vocabulary, the embedding's gradient is a one-hot product
    /// ([`gpu::embedding`](crate::gpu::embedding)) rather than Burn's scatter; the same rows.
    fn embed_tokens(&self, tokens: Tensor<2, Int>, pass: Pass) -> Tensor<3> {
        let weights = self.wte.weight.val();
        // Tracked, not only a leaf: a step's tied embedding is read through one node of its own
        // ([`Gpt::autocast`]).
        let one_hot_gradient = pass == Pass::Train
            && self.kernels.fuse(weights.dtype())
            && self.vocab_size() <= crate::gpu::ONE_HOT_VOCAB;
        match one_hot_gradient {
            true => crate::gpu::embedding(weights, tokens),
            false => self.wte.forward(tokens),
        }
    }

    /// Token ids must index the embedding: an out-of-range id is an error, not a garbage read.
    /// Runs on the host, where a batch is built, so the forward pass never waits for the device.
    pub fn check_tokens(&self, ids: &[i64]) -> Result<(), ModelError> {
        let vocab_size = self.vocab_size();
        match ids
            .iter()
            .find(|&&id| !(0..vocab_size as i64).contains(&id))
        {
            Some(&id) => Err(ModelError::TokenOutOfRange { id, vocab_size }),
            None => Ok(()),
        }
    }

    /// Final norm and LM head: `[batch, seq, n_embd] -> [batch, seq, vocab_size]`. The
    /// logits come back in the residual stream's dtype (f32), where the loss's softmax runs,
    /// soft-capped when the config says so.
    pub(crate) fn head(&self, x: Tensor<3>) -> Tensor<3> {
        let dtype = x.dtype();
        let x = norm(&self.ln_f, x);
        let rows = self.rows_kernel() && rows::takes(&x);
        let logits = match &self.lm_head {
            Some(head) if rows => rows::linear(head, x.cast(head.weight.dtype())),
            Some(head) => head.forward(x.cast(head.weight.dtype())),
            // Tied: logits = x · wteᵀ, the embedding read backwards.
            None if rows => rows::product(x, self.wte.weight.val().transpose(), None),
            None => linear_op(x, self.wte.weight.val().transpose(), None),
        };
        let logits = logits.cast(dtype);
        let cap = self.config.logit_softcap;
        if cap > 0.0 {
            logits.div_scalar(cap).tanh().mul_scalar(cap)
        } else {
            logits
        }
    }

    /// The dtype its matrices compute in: f32 as trained, bf16 or f16 after
    /// [`autocast`](Self::autocast) (embeddings and norms stay f32 either way).
    pub fn dtype(&self) -> DType {
        match &self.lm_head {
            Some(head) => head.weight.dtype(),
            None => self.wte.weight.dtype(),
        }
    }

    /// This model for a mixed-precision step in `dtype` (bf16 or f16), nanoGPT's autocast:
    /// every linear layer's weight and bias (the LM head's too, tied or not) becomes a cast of
    /// the f32 parameter, so the matmuls and the activations between them run in `dtype`, and
    /// the gradients flow back through the casts to the f32 parameters, which AdamW updates.
    /// Embeddings, the residual stream, LayerNorms, the attention softmax and the logits stay
    /// f32. Take gradients with respect to `self`, not the returned model; f32 returns a clone
    /// (its tied embedding read through one node, see [`read_once`]).
    pub fn autocast(&self, dtype: FloatDType) -> Gpt {
        let mut model = self.clone();
        let wte = self.wte.weight.val();
        if self.lm_head.is_none() && wte.is_require_grad() {
            model.wte.weight = Param::initialized(ParamId::new(), read_once(wte));
        }
        if dtype == FloatDType::F32 {
            return model;
        }
        let cast = |linear: &Linear| Linear {
            weight: linear.weight.clone().map(|w| w.cast(dtype)),
            bias: linear.bias.clone().map(|b| b.map(|b| b.cast(dtype))),
        };
        for block in &mut model.h {
            block.attn.c_attn = cast(&block.attn.c_attn);
            block.attn.c_proj = cast(&block.attn.c_proj);
            if let Some(mlp) = &mut block.mlp {
                mlp.c_fc = cast(&mlp.c_fc);
                mlp.c_proj = cast(&mlp.c_proj);
            }
        }
        model.lm_head = Some(match &self.lm_head {
            Some(head) => cast(head),
            None => Linear {
                // Not `Param::from_tensor`: that would mark the cast, a graph node, as a leaf.
                weight: Param::initialized(
                    ParamId::new(),
                    model.wte.weight.val().transpose().cast(dtype),
                ),
                bias: None,
            },
        });
        model
    }

    /// Bytes its parameters take on the device, each in its own dtype: `4 · num_params` as
    /// trained; after [`autocast`](Self::autocast) the matrices at 2 a weight, beside the f32
    /// embeddings and norms (a tied head's cast counted: it is a tensor of its own).
    pub fn bytes(&self) -> usize {
        struct Bytes(usize);
        impl ModuleVisitor for Bytes {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                let value = param.val();
                self.0 += value.shape().num_elements() * value.dtype().size();
            }
        }
        let mut bytes = Bytes(0);
        self.visit(&mut bytes);
        bytes.0
    }

    /// Parameters, counting a tied matrix once.
    pub fn num_params(&self) -> usize {
        Module::num_params(self)
    }

    /// Parameters without the position embedding: the figure nanoGPT prints ("0.80M").
    pub fn num_params_non_embedding(&self) -> usize {
        let wpe = self.wpe.as_ref();
        // The shape without reading the values (a lazy parameter stays unmade).
        self.num_params() - wpe.map_or(0, |wpe| wpe.weight.lazy_shape().num_elements())
    }

    /// The parameters weight decay applies to: every 2-D weight (linear layers and embeddings),
    /// as nanoGPT's `configure_optimizers`; biases and norm gains are left alone.
    pub fn decayed_param_ids(&self) -> Vec<ParamId> {
        struct Matrices(Vec<ParamId>);
        impl ModuleVisitor for Matrices {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                if D >= 2 {
                    self.0.push(param.id);
                }
            }
        }
        let mut visitor = Matrices(Vec::new());
        self.visit(&mut visitor);
        visitor.0
    }
}

/// `weights` `[vocab, n_embd]` through a graph node of its own (a flat view and back: no copy),
/// for a tied embedding that the step reads twice, as the embedding and as the LM head.
///
/// Why: the backward adds the two reads' gradients where they meet. Met at the parameter
/// itself, that addition is the backward's last operation, and Burn's fusion (0.22) keeps an
/// element-wise operation open for more: the thousands of buffer releases that follow the
/// backward then each re-run its search over all of them, minutes of host time at
/// shakespeare-char's size before the first step (over 5 minutes on lavapipe, measured). Met here,
/// the addition is followed by this node's reshape, which closes it.
fn read_once(weights: Tensor<2>) -> Tensor<2> {
    let [vocab, n_embd] = weights.dims();
    weights.reshape([vocab * n_embd]).reshape([vocab, n_embd])
}
