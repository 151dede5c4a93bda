//! Switches for measuring: on a GPU, ways to the same numbers that tinygpt does not take by
//! default (they measured slower), kept so that one can be measured against the other. The
//! model crate takes each as a typed setting ([`Kernels`], [`Decoding`]); this is the one place
//! that reads them from the environment, once per command, when a backend is placed
//! ([`Backend::placement`](super::Backend::placement)). docs/backends.md lists them.

use tinygpt_model::gpu::Kernels;
use tinygpt_model::{Decoding, Gpt, decoding::DecodeStep};

/// Each switch: the variable, and what setting it does.
pub const VARIABLES: [(&str, &str); 4] = [
    (
        "TINYGPT_BURN_OPS",
        "set: Burn's tensor ops everywhere on a GPU (norms, loss, AdamW, attention, decoding) \
         instead of tinygpt's kernels",
    ),
    (
        "TINYGPT_DECODE_STEP",
        "`0`: decode through the cached forward; `step`: through the fixed step, launch by \
         launch; unset: the step captured as a device graph and replayed",
    ),
    (
        "TINYGPT_ROWS_LINEAR",
        "`0`: a decode step's products by Burn's matmul instead of the rows kernel",
    ),
    (
        "TINYGPT_DECODE_ATTENTION",
        "`0`: a decode step's attention as tensor ops over a mask instead of one kernel a layer",
    ),
];

/// What the switches say: Burn's ops everywhere, and how a GPU model decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Switches {
    /// Burn's tensor ops on a GPU too ([`Kernels::Burn`]).
    pub burn_ops: bool,
    pub decoding: Decoding,
}

impl Switches {
    /// The switches as the environment sets them ([`VARIABLES`]).
    pub(crate) fn from_env() -> Self {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The switches as `var` (a variable's value, if set) says.
    pub(crate) fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let off = |name: &str| var(name).as_deref() == Some("0");
        Self {
            burn_ops: var("TINYGPT_BURN_OPS").is_some(),
            decoding: Decoding {
                step: match var("TINYGPT_DECODE_STEP").as_deref() {
                    Some("0") => DecodeStep::Forward,
                    Some("step") => DecodeStep::Step,
                    _ => DecodeStep::Captured,
                },
                rows_kernel: !off("TINYGPT_ROWS_LINEAR"),
                attention_kernel: !off("TINYGPT_DECODE_ATTENTION"),
            },
        }
    }

    /// `model` running as the switches say (on a CPU, as it was: Burn's ops are all it has).
    pub(crate) fn apply(&self, model: Gpt) -> Gpt {
        let model = model.with_decoding(self.decoding);
        match self.burn_ops {
            true => model.with_kernels(Kernels::Burn),
            false => model,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nothing set is every default; each variable moves its own setting only.
    #[test]
    fn each_variable_sets_its_switch() {
        let set = |pairs: &'static [(&'static str, &'static str)]| {
            Switches::from_vars(move |name| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            })
        };
        assert_eq!(set(&[]), Switches::default());
        assert!(set(&[("TINYGPT_BURN_OPS", "1")]).burn_ops);
        let decoding = |pairs| set(pairs).decoding;
        let step = |value| decoding(value).step;
        assert_eq!(step(&[("TINYGPT_DECODE_STEP", "0")]), DecodeStep::Forward);
        assert_eq!(step(&[("TINYGPT_DECODE_STEP", "step")]), DecodeStep::Step);
        assert_eq!(step(&[("TINYGPT_DECODE_STEP", "x")]), DecodeStep::Captured);
        let rows = decoding(&[("TINYGPT_ROWS_LINEAR", "0")]);
        assert!(!rows.rows_kernel && rows.attention_kernel);
        let attention = decoding(&[("TINYGPT_DECODE_ATTENTION", "0")]);
        assert!(attention.rows_kernel && !attention.attention_kernel);
        assert!(decoding(&[("TINYGPT_ROWS_LINEAR", "1")]).rows_kernel);
        // Every variable the table lists is one that is read.
        for (name, _) in VARIABLES {
            let zero = Switches::from_vars(|n| (n == name).then(|| "0".into()));
            assert_ne!(zero, Switches::default(), "{name} moves nothing");
        }
    }
}
