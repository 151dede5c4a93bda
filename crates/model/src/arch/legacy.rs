//! `[model]` as files written before the parts spelled it, read into the parts: `layer_norm =
//! false` is `norm = "none"`, `mlp = false` is `mlp = "none"`, and `activation = "gelu_tanh"`
//! (the nonlinearity's name, which is the MLP part's) is `mlp = "gelu_tanh"`. Nothing writes
//! these spellings any more; run directories and configs from before still hold them.

use serde::Deserialize;

use super::parts::{Mlp, Norm};

/// How `[model]` spelled the MLP before the parts: `mlp = true | false`, or a part's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub(super) enum MlpSetting {
    On(bool),
    Part(Mlp),
}

/// The parts from the settings a config file may hold, the older spellings included; an error
/// names the keys that contradict each other.
pub(super) fn resolve(
    norm: Option<Norm>,
    layer_norm: Option<bool>,
    mlp: Option<MlpSetting>,
    activation: Option<Mlp>,
) -> Result<(Norm, Mlp), String> {
    let norm = match (norm, layer_norm) {
        (Some(_), Some(_)) => {
            return Err("give `norm`, not also the older `layer_norm`".into());
        }
        (Some(norm), None) => norm,
        (None, Some(true) | None) => Norm::Layer,
        (None, Some(false)) => Norm::None,
    };
    let mlp = match (mlp, activation) {
        (Some(MlpSetting::Part(_)), Some(_)) => {
            return Err(
                "give `mlp = \"gelu_tanh\"` (or another part), not also the older \
                        `activation`"
                    .into(),
            );
        }
        (Some(MlpSetting::Part(mlp)), None) => mlp,
        // Older run directories wrote `activation` always, and `mlp = false` beside it.
        (Some(MlpSetting::On(false)), _) => Mlp::None,
        (Some(MlpSetting::On(true)) | None, None) => Mlp::Gelu,
        (Some(MlpSetting::On(true)) | None, Some(Mlp::None)) => {
            return Err(
                "`activation` names the MLP's nonlinearity; write `mlp = \"none\"` for no MLP"
                    .into(),
            );
        }
        (Some(MlpSetting::On(true)) | None, Some(activation)) => activation,
    };
    Ok((norm, mlp))
}
