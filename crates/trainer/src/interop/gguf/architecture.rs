//! The llama.cpp architectures GGUF files are written in and read from: the one that computes
//! a model exactly (an export), or the one a file names (an import).

use anyhow::{Result, bail};
use tinygpt_model::GptConfig;
use tinygpt_model::parts::Position;

pub use super::difference::Approximation;
use super::llama::Flavour;
use super::{gpt2, llama};

/// The llama.cpp architectures an export writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// GPT-2's parts: learned positions, LayerNorm, a GELU (tanh) MLP.
    Gpt2,
    /// Llama's parts: rotary positions, RMSNorm, SwiGLU, grouped-query attention; with
    /// QK-norm as `qwen3`.
    Llama(llama::Flavour),
}

impl Architecture {
    /// Whether its files store a query or key projection's rows in llama.cpp's rotary layout.
    pub fn interleaves(self) -> bool {
        match self {
            Architecture::Gpt2 => false,
            Architecture::Llama(flavour) => flavour.interleaves(),
        }
    }

    /// `general.architecture`.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Gpt2 => "gpt2",
            Architecture::Llama(flavour) => flavour.name(),
        }
    }

    /// The architecture a file's `general.architecture` names, if tinygpt reads it.
    pub fn named(name: &str) -> Option<Architecture> {
        match name {
            "gpt2" => Some(Architecture::Gpt2),
            "llama" => Some(Architecture::Llama(Flavour::Llama)),
            "qwen3" => Some(Architecture::Llama(Flavour::Qwen3)),
            "arcee" => Some(Architecture::Llama(Flavour::Arcee)),
            _ => None,
        }
    }

    /// The architecture that computes a model of `config`, and the parts it computes only
    /// approximately; or one line saying which part none computes and how to train a model
    /// that exports. A model with learned positions is told what `gpt2` lacks; any other what
    /// `llama` (or `qwen3`) lacks.
    pub fn of(config: &GptConfig) -> Result<(Architecture, Vec<Approximation>)> {
        let (gpt2, llama) = (gpt2::expressible(config), llama::expressible(config));
        let architectures = "GGUF export writes llama.cpp's gpt2, llama or qwen3 architecture";
        match (gpt2, llama, config.position) {
            (Ok(approximations), _, _) => Ok((Architecture::Gpt2, approximations)),
            (_, Ok(flavour), _) => Ok((Architecture::Llama(flavour), vec![])),
            (Err(part), _, Position::Learned) => {
                bail!("{architectures}; gpt2 cannot compute a model {part}")
            }
            (_, Err(part), _) => bail!("{architectures}; llama cannot compute a model {part}"),
        }
    }
}
