//! PEFT's `modules_to_save`: parts of the base trained in full beside the adapters (tinygpt's
//! `[lora] also_train`), saved whole in the adapter's file under their Hugging Face names
//! (`base_model.model.model.embed_tokens.weight`, `base_model.model.lm_head.weight`).
//!
//! A tied head is the embedding. PEFT keeps the two tied only with `ensure_weight_tying`
//! (then it saves both, equal); without it, its copy of one of them trains apart from the
//! other, a model tinygpt's tied one cannot compute, which the import refuses.

use std::collections::BTreeMap;

use anyhow::{Result, anyhow, bail};
use tinygpt_model::{
    Gpt, GptConfig, LoraConfig, names::Slot, names::TrainedPart, names::parameter_table,
    names::trained_beside,
};

use super::matrix::Matrix;
use super::{Family, PREFIX};
use crate::interop::foreign::{Foreign, LM_HEAD, NamedTensor, burn_tensors};

/// The Hugging Face tensor of `slot` in `family`'s model and whether it is stored transposed
/// from Burn's layout; `None` where that model has no such tensor. An exhaustive match: a new
/// slot says where PEFT would save it.
fn hf_tensor(family: Family, slot: Slot) -> Option<(&'static str, bool)> {
    match (family, slot) {
        (Family::Llama, Slot::TokenEmbedding) => Some(("model.embed_tokens.weight", false)),
        (Family::Gpt2, Slot::TokenEmbedding) => Some(("transformer.wte.weight", false)),
        (Family::Gpt2, Slot::PositionEmbedding) => Some(("transformer.wpe.weight", false)),
        (Family::Llama, Slot::PositionEmbedding) => None,
        // `nn.Linear`'s `[vocab, n_embd]`, Burn's `[n_embd, vocab]`.
        (_, Slot::LmHead) => Some((LM_HEAD, true)),
        (_, Slot::BigramEmbedding)
        | (_, Slot::Block(..))
        | (_, Slot::FinalNormGain)
        | (_, Slot::FinalNormBias)
        | (_, Slot::Adapter { .. }) => None,
    }
}

/// The part of the base a slot PEFT can save belongs to.
fn part_of(slot: Slot) -> TrainedPart {
    match slot {
        Slot::LmHead => TrainedPart::Head,
        _ => TrainedPart::Embedding,
    }
}

/// Its module's name in `modules_to_save`: `embed_tokens.weight` → `embed_tokens`.
fn module(tensor: &str) -> String {
    let path = tensor.trim_end_matches(".weight");
    path.rsplit('.').next().unwrap_or(path).to_string()
}

/// The parts of a LoRA run's base trained beside its adapters, as PEFT saves them.
pub(super) struct Saved {
    pub tensors: Vec<NamedTensor>,
    /// `modules_to_save`.
    pub modules: Vec<String>,
    /// `ensure_weight_tying`: the head is tied to a saved embedding.
    pub tied: bool,
}

/// The parts of `file` (a LoRA checkpoint's tensors by Burn path) that `lora` trains in a model
/// of `gpt`, taken out of it, named for `family`'s model.
pub(super) fn export(
    family: Family,
    gpt: &GptConfig,
    lora: &LoraConfig,
    file: &mut BTreeMap<String, Foreign>,
) -> Result<Saved> {
    let mut saved = Saved {
        tensors: Vec::new(),
        modules: Vec::new(),
        tied: false,
    };
    for p in trained_beside(gpt, &lora.also_train) {
        let (name, transposed) = hf_tensor(family, p.slot).ok_or_else(|| {
            anyhow!(
                "PEFT has no module for `{}`, trained beside the adapters",
                p.burn
            )
        })?;
        let t = file
            .remove(&p.burn)
            .ok_or_else(|| anyhow!("`{}`, trained beside the adapters, is missing", p.burn))?;
        let mut m = Matrix::from_foreign(&p.burn, t)?;
        if transposed {
            m = m.transposed();
        }
        // PEFT's own files of a tied Llama hold the head beside the embedding, equal.
        if gpt.tie_embeddings && family == Family::Llama && p.slot == Slot::TokenEmbedding {
            saved
                .tensors
                .push(m.clone().named(format!("{PREFIX}{LM_HEAD}")));
        }
        saved.tied |= gpt.tie_embeddings && p.slot == Slot::TokenEmbedding;
        saved.modules.push(module(name));
        saved.tensors.push(m.named(format!("{PREFIX}{name}")));
    }
    Ok(saved)
}

/// The parts of the base an adapter trained (`modules_to_save`, their tensors taken out of
/// `tensors`, keyed by their Hugging Face names) for a base `base` of `gpt` in `family`'s
/// format: which parts, and every tensor of those parts by Burn path (those the adapter did
/// not save, such as GPT-2's `wpe` beside a saved `wte`, are the base's).
pub(super) fn import(
    family: Family,
    gpt: &GptConfig,
    (modules, ensure_weight_tying): (&[String], bool),
    tensors: &mut BTreeMap<String, (String, Foreign)>,
    base: &Gpt,
) -> Result<(Vec<TrainedPart>, Vec<NamedTensor>)> {
    let known = |tensor: &str| tensors.contains_key(tensor);
    for named in modules {
        let name = module(named);
        let ours = parameter_table(gpt).into_iter().filter(|p| p.present);
        let mut hf = ours
            .filter_map(|p| hf_tensor(family, p.slot))
            .map(|(t, _)| t);
        let hf = hf
            .find(|t| module(t) == name)
            .or(gpt.tie_embeddings.then_some(LM_HEAD));
        match hf.filter(|t| module(t) == name) {
            None => bail!(
                "modules_to_save names `{named}`, which tinygpt's LoRA does not train in full \
                 (it trains the embedding and the head)"
            ),
            Some(tensor) if !known(tensor) => {
                bail!("modules_to_save names `{named}`, but the file holds no `{tensor}`")
            }
            Some(_) => {}
        }
    }
    let mut parts = Vec::new();
    let mut out: BTreeMap<String, Matrix> = BTreeMap::new();
    for p in parameter_table(gpt).into_iter().filter(|p| p.present) {
        let Some((hf, transposed)) = hf_tensor(family, p.slot) else {
            continue;
        };
        let Some((name, t)) = tensors.remove(hf) else {
            continue;
        };
        let m = fitted(&name, t, &p.slot.shape(gpt), transposed)?;
        parts.push(part_of(p.slot));
        out.insert(p.burn, m);
    }
    if gpt.tie_embeddings {
        tied_head(gpt, ensure_weight_tying, tensors, &mut parts, &mut out)?;
    }
    parts.sort();
    parts.dedup();
    let mut base_tensors = None;
    for p in trained_beside(gpt, &parts) {
        if !out.contains_key(&p.burn) {
            let all = match &mut base_tensors {
                Some(all) => all,
                None => base_tensors.insert(burn_tensors(base)?),
            };
            let (shape, bytes) = all
                .remove(&p.burn)
                .ok_or_else(|| anyhow!("the base has no `{}`", p.burn))?;
            let values = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let t = Foreign { shape, values };
            out.insert(p.burn.clone(), Matrix::from_foreign(&p.burn, t)?);
        }
    }
    let named = out.into_iter().map(|(burn, m)| m.named(burn)).collect();
    Ok((parts, named))
}

/// A tied model's head as the adapter saved it (`lm_head.weight`): the embedding it is tied
/// to. Equal to a saved embedding, or the embedding itself where only the head was saved;
/// refused where PEFT's model would have the two apart.
fn tied_head(
    gpt: &GptConfig,
    ensure_weight_tying: bool,
    tensors: &mut BTreeMap<String, (String, Foreign)>,
    parts: &mut Vec<TrainedPart>,
    out: &mut BTreeMap<String, Matrix>,
) -> Result<()> {
    let wte = parameter_table(gpt)
        .into_iter()
        .find(|p| p.slot == Slot::TokenEmbedding)
        .map(|p| p.burn)
        .unwrap_or_default();
    let head = match tensors.remove(LM_HEAD) {
        Some((name, t)) => Some(fitted(&name, t, &Slot::TokenEmbedding.shape(gpt), false)?),
        None => None,
    };
    let embedding = out.get(&wte);
    let same = match (embedding, &head) {
        (Some(e), Some(h)) if e != h => bail!(
            "the adapter's embed_tokens and lm_head differ, but the base ties its head to its \
             embedding"
        ),
        (Some(_), Some(_)) => true,
        _ => false,
    };
    if !ensure_weight_tying && !same && (embedding.is_some() || head.is_some()) {
        bail!(
            "the adapter trains the embedding or the head of a model whose head is tied to its \
             embedding, without ensure_weight_tying: PEFT then trains them apart, which the \
             tied model cannot compute (save it with ensure_weight_tying=True)"
        );
    }
    if let Some(head) = head {
        parts.push(TrainedPart::Head);
        out.entry(wte).or_insert(head);
    }
    Ok(())
}

/// Tensor `name` as a matrix of Burn's `shape` (`transposed`: stored the other way round),
/// or why it does not fit.
fn fitted(name: &str, t: Foreign, shape: &[usize], transposed: bool) -> Result<Matrix> {
    let m = Matrix::from_foreign(name, t)?;
    let m = if transposed { m.transposed() } else { m };
    if [m.rows, m.cols][..] != *shape {
        bail!(
            "`{name}` is {}x{}, but the base's is {}",
            m.rows,
            m.cols,
            shape
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("x")
        );
    }
    Ok(m)
}
