//! [`Decoding`]: the ways a model on a GPU may decode where several give the same tokens, set
//! where the model is built and read by its decoders (`decode/`).

/// How a decoder on a GPU feeds its tokens: one new token, and a prompt in chunks through the
/// same step, or both through [`Gpt::forward_cached`](crate::Gpt::forward_cached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeStep {
    /// [`Gpt::forward_cached`](crate::Gpt::forward_cached), as longer feeds: the position
    /// reaches the kernels as launch arguments.
    Forward,
    /// [`Gpt::forward_step`](crate::Gpt::forward_step): the same launches at every position,
    /// the position in a buffer; a prompt goes through the same step in fixed chunks of
    /// tokens, so its length changes no launch either.
    Step,
    /// The step and the pick captured once and replayed for every token: on CUDA one graph
    /// launch per token (shakespeare-char's size on an H100: 769 tokens/s against the step's
    /// 194, docs/perf.md).
    Captured,
}

/// How a model on a GPU ([`Kernels::Cube`](crate::gpu::Kernels::Cube)) decodes where more than one way gives the same
/// tokens: the defaults are the ways measured fastest, the others kept to measure one against
/// another (docs/perf.md). A CPU model has one way and ignores it. Set with
/// [`Gpt::with_decoding`](crate::Gpt::with_decoding); the `tinygpt` binary maps environment
/// variables to its fields (docs/backends.md, "Switches for measuring").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoding {
    /// How single tokens (and prompts) are fed. Default: [`DecodeStep::Captured`].
    pub step: DecodeStep,
    /// A step's products of at most [`MAX_ROWS`](crate::gpu::rows::MAX_ROWS) rows by the rows
    /// kernel ([`crate::gpu::rows`]) rather than Burn's matmul. Default: on.
    pub rows_kernel: bool,
    /// A decode step's attention in one kernel a layer
    /// ([`tinygpt_attention::decode_attention`]) rather than tensor ops over a mask.
    /// Default: on.
    pub attention_kernel: bool,
}

impl Default for Decoding {
    fn default() -> Self {
        Self {
            step: DecodeStep::Captured,
            rows_kernel: true,
            attention_kernel: true,
        }
    }
}
