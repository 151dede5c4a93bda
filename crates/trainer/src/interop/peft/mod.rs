//! PEFT's LoRA adapters, in and out: a directory of `adapter_config.json` and
//! `adapter_model.safetensors` that `PeftModel.from_pretrained` attaches to a Hugging Face
//! model, here to the base run's export (`--format hf`: GPT-2 or Llama).
//!
//! PEFT adapts each `nn.Linear` (or GPT-2's `Conv1D`) on its own: `lora_A.weight [r, in]`,
//! `lora_B.weight [out, r]`, scaled by `lora_alpha / r`. tinygpt packs a Llama block's
//! `q_proj`, `k_proj`, `v_proj` into one matrix and `gate_proj`, `up_proj` into another, with
//! one adapter each ([`LoraTarget`]); GPT-2's matrices are packed as tinygpt's. So:
//! - **out**: a packed adapter `A [in, R]`, `B [R, out]` is, for each module, `lora_A = Aᵀ`
//!   (shared) and `lora_B` = the module's columns of `B`, transposed: exactly the same update.
//! - **in**: the modules of a packed matrix whose `lora_A` are equal keep it shared (what an
//!   export wrote); otherwise their factors are stacked, `A = [A_q | A_k | A_v]` and `B`
//!   block-diagonal (rank `r_q + r_k + r_v`), a module without an adapter as zero columns.
//!   Every adapter is padded with zeros to the largest rank (tinygpt's runs have one), and a
//!   module's own scale is folded into its `B`: the model computes what PEFT's does.
//!
//! Parts of the base trained in full beside the adapters (`[lora] also_train`) are PEFT's
//! `modules_to_save` (`saved.rs`).

mod matrix;
mod saved;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use tinygpt_model::{
    BaseWeights, Gpt, GptConfig, LoraConfig, LoraTarget, names::Factor, names::TrainedPart,
    names::adapter_path,
};

use self::matrix::Matrix;
use super::foreign::{Foreign, NamedTensor, read_safetensors, write_safetensors};
use super::run::Imported;
use crate::fs::temp_beside;
use crate::run::checkpoint::{LoraBase, Run, TrainState, Which, refuse_existing};

const CONFIG: &str = "adapter_config.json";
const WEIGHTS: &str = "adapter_model.safetensors";
/// What `get_peft_model_state_dict` puts before a module's path.
const PREFIX: &str = "base_model.model.";

/// The Hugging Face format of the base: where its modules are and how they are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Gpt2,
    Llama,
}

impl Family {
    /// The Hugging Face format of a model of `gpt`, or why PEFT has none for it.
    fn of(gpt: &GptConfig) -> Result<Self> {
        match (super::hf::expressible(gpt), super::llama::expressible(gpt)) {
            (Ok(_), _) => Ok(Family::Gpt2),
            (Err(_), Ok(())) => Ok(Family::Llama),
            (Err(gpt2), Err(llama)) => bail!(
                "PEFT adapters attach to a Hugging Face model, and neither GPT-2's format \
                 computes a model {gpt2} nor Llama's one {llama}"
            ),
        }
    }

    /// Block `layer`'s path in the Hugging Face model.
    fn layer(self, layer: usize) -> String {
        match self {
            Family::Gpt2 => format!("transformer.h.{layer}."),
            Family::Llama => format!("model.layers.{layer}."),
        }
    }

    /// The Hugging Face modules that make up tinygpt's `target` matrix in a model of `gpt`:
    /// each module's path under a block, its name in `target_modules`, and the columns of the
    /// packed matrix it computes. An exhaustive match: a new target does not compile until it
    /// says where it goes.
    fn modules(
        self,
        gpt: &GptConfig,
        target: LoraTarget,
    ) -> Vec<(&'static str, &'static str, Range<usize>)> {
        let (c, h) = (gpt.n_embd, gpt.mlp_width());
        let (q, kv) = (
            gpt.n_head * gpt.head_size(),
            gpt.kv_heads() * gpt.head_size(),
        );
        match (self, target) {
            (Family::Gpt2, LoraTarget::Qkv) => vec![("attn.c_attn", "c_attn", 0..gpt.qkv_width())],
            // GPT-2 has two `c_proj`s: `target_modules` names them by their parent too.
            (Family::Gpt2, LoraTarget::AttnProj) => vec![("attn.c_proj", "attn.c_proj", 0..c)],
            (Family::Gpt2, LoraTarget::Fc) => vec![("mlp.c_fc", "c_fc", 0..gpt.fc_width())],
            (Family::Gpt2, LoraTarget::MlpProj) => vec![("mlp.c_proj", "mlp.c_proj", 0..c)],
            (Family::Llama, LoraTarget::Qkv) => vec![
                ("self_attn.q_proj", "q_proj", 0..q),
                ("self_attn.k_proj", "k_proj", q..q + kv),
                ("self_attn.v_proj", "v_proj", q + kv..q + 2 * kv),
            ],
            (Family::Llama, LoraTarget::AttnProj) => vec![("self_attn.o_proj", "o_proj", 0..c)],
            (Family::Llama, LoraTarget::Fc) => vec![
                ("mlp.gate_proj", "gate_proj", 0..h),
                ("mlp.up_proj", "up_proj", h..2 * h),
            ],
            (Family::Llama, LoraTarget::MlpProj) => vec![("mlp.down_proj", "down_proj", 0..c)],
        }
    }
}

/// The fields of PEFT's `LoraConfig` that say what an adapter computes.
#[derive(Deserialize)]
struct PeftConfig {
    peft_type: Option<String>,
    r: usize,
    lora_alpha: f64,
    #[serde(default)]
    lora_dropout: f64,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    lora_bias: bool,
    #[serde(default = "no_bias")]
    bias: String,
    #[serde(default)]
    modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    ensure_weight_tying: bool,
    #[serde(default)]
    alpha_pattern: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    layer_replication: Option<serde_json::Value>,
    #[serde(default)]
    use_qalora: bool,
    #[serde(default)]
    base_model_name_or_path: Option<String>,
}

fn no_bias() -> String {
    "none".into()
}

impl PeftConfig {
    fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(CONFIG);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let config: Self = serde_json::from_str(&text)
            .map_err(|e| anyhow!("{}: not a PEFT LoRA config ({e})", path.display()))?;
        config
            .refuse_what_tinygpt_lacks()
            .with_context(|| path.display().to_string())?;
        Ok(config)
    }

    /// Anything that would compute another function than `W + scale · A · B` per module, by
    /// name.
    fn refuse_what_tinygpt_lacks(&self) -> Result<()> {
        if let Some(kind) = self.peft_type.as_deref().filter(|k| *k != "LORA") {
            bail!("a {kind} adapter; tinygpt reads LoRA adapters only");
        }
        if self.use_dora {
            bail!("use_dora: a DoRA adapter (its magnitude vectors are not LoRA's update)");
        }
        if self.use_qalora {
            bail!("use_qalora: a QA-LoRA adapter (its inputs are pooled, not LoRA's update)");
        }
        if self
            .layer_replication
            .as_ref()
            .is_some_and(|v| !v.is_null())
        {
            bail!("layer_replication builds another model than the base's layers");
        }
        if self.bias != "none" || self.lora_bias {
            bail!(
                "the adapter trains biases (bias = {:?}); tinygpt's adapters have none",
                self.bias
            );
        }
        if !self.alpha_pattern.is_empty() {
            bail!("alpha_pattern sets other scales for some modules; tinygpt reads one lora_alpha");
        }
        if self.r == 0 || self.lora_alpha <= 0.0 {
            bail!("r and lora_alpha must be positive");
        }
        Ok(())
    }

    /// The scale of a module's adapter of rank `rank`.
    fn scale(&self, rank: usize) -> f64 {
        match self.use_rslora {
            true => self.lora_alpha / (rank as f64).sqrt(),
            false => self.lora_alpha / rank as f64,
        }
    }
}

/// Writes the adapters of the LoRA run `run` (its `which` checkpoint) as a PEFT adapter
/// directory `out` (which must not exist, or be empty), complete or not at all. Returns the
/// rank and the number of tensors written.
pub fn export(run: &Run, which: Which, out: &Path) -> Result<(usize, usize)> {
    let Some(lora) = &run.config.lora else {
        bail!(
            "{} is not a LoRA run: it has no adapters to export (train one with --lora, or \
             export the whole model with --format hf)",
            run.dir.display()
        );
    };
    let gpt = run.config.gpt(run.tokenizer.vocab_size());
    let family = Family::of(&gpt)?;
    refuse_existing(out)?;
    let checkpoint = run.checkpoint(which, false)?;
    let mut factors = read_safetensors(&checkpoint.dir.join("model.safetensors"))?;
    let mut tensors = Vec::new();
    let mut names = Vec::new();
    for target in lora.targets(&gpt) {
        for (_, name, _) in family.modules(&gpt, target) {
            names.push(name);
        }
        for l in 0..gpt.n_layer {
            let mut factor = |f: Factor| -> Result<Matrix> {
                let name = adapter_path(l, target, f);
                let t = factors
                    .remove(&name)
                    .ok_or_else(|| anyhow!("adapter `{name}` is missing"))?;
                Matrix::from_foreign(&name, t)
            };
            let (a, b) = (factor(Factor::A)?, factor(Factor::B)?);
            let a = a.transposed();
            for (module, _, cols) in family.modules(&gpt, target) {
                let key = format!("{PREFIX}{}{module}", family.layer(l));
                tensors.push(a.clone().named(format!("{key}.lora_A.weight")));
                tensors.push(
                    b.columns(cols)
                        .transposed()
                        .named(format!("{key}.lora_B.weight")),
                );
            }
        }
    }
    let saved = saved::export(family, &gpt, lora, &mut factors)?;
    tensors.extend(saved.tensors);
    let base = checkpoint
        .state
        .lora_base
        .as_ref()
        .map(|b| b.run.display().to_string());
    let config = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora.rank,
        "lora_alpha": lora.scale() * lora.rank as f64,
        "lora_dropout": lora.dropout,
        "target_modules": names,
        "bias": "none",
        "fan_in_fan_out": family == Family::Gpt2,
        "modules_to_save": (!saved.modules.is_empty()).then_some(saved.modules),
        "ensure_weight_tying": saved.tied,
        "use_rslora": false,
        "use_dora": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "layers_to_transform": null,
        "rank_pattern": {},
        "alpha_pattern": {},
    });
    let temp = temp_beside(out, "export")?;
    let write = |name: &str, bytes: &[u8]| {
        std::fs::write(temp.path().join(name), bytes)
            .with_context(|| format!("cannot write {}", out.join(name).display()))
    };
    write(WEIGHTS, &write_safetensors(&tensors)?)?;
    write(CONFIG, serde_json::to_string_pretty(&config)?.as_bytes())?;
    std::fs::rename(temp.keep(), out)
        .with_context(|| format!("cannot create {}", out.display()))?;
    Ok((lora.rank, tensors.len()))
}

/// Whether `dir` is a PEFT adapter directory.
pub(crate) fn is_adapter(dir: &Path) -> bool {
    dir.join(CONFIG).exists()
}

/// Imports the PEFT LoRA adapter directory `dir` as a LoRA run `out` of the run `base` (a
/// model imported from, or exportable to, the Hugging Face directory the adapter was trained
/// on).
pub fn import(dir: &Path, base: &Path, out: &Path) -> Result<Imported> {
    let peft = PeftConfig::read(dir)?;
    let base = Run::open(base).context("the adapter's base (--base)")?;
    if base.config.lora.is_some() {
        bail!(
            "{} is a LoRA run; the base must be a whole model",
            base.dir.display()
        );
    }
    let gpt = base.config.gpt(base.tokenizer.vocab_size());
    let family = Family::of(&gpt).with_context(|| format!("the base {}", base.dir.display()))?;
    let weights = dir.join(WEIGHTS);
    if !weights.exists() {
        bail!(
            "{} has no {WEIGHTS} (an adapter_model.bin is PyTorch's pickle: save the adapter \
             with safe_serialization=True, PEFT's default)",
            dir.display()
        );
    }
    let mut tensors = BTreeMap::new();
    for (name, t) in read_safetensors(&weights)? {
        let bare = name.strip_prefix(PREFIX).unwrap_or(&name).to_string();
        tensors.insert(bare, (name, t));
    }
    let mut notes = Vec::new();
    let mut adapters = Adapters::read(&peft, family, &gpt, &mut tensors, &mut notes)?;
    let (model, _) = base.load_model(Which::Best, &burn::tensor::Device::flex())?;
    let modules = peft.modules_to_save.clone().unwrap_or_default();
    let saving = (&modules[..], peft.ensure_weight_tying);
    (adapters.also_train, adapters.saved) =
        saved::import(family, &gpt, saving, &mut tensors, &model)
            .with_context(|| weights.display().to_string())?;
    if let Some(modules) = peft.modules_to_save.as_ref().filter(|m| !m.is_empty()) {
        let parts: Vec<&str> = adapters.also_train.iter().map(|p| p.name()).collect();
        notes.push(format!(
            "modules_to_save ({}) train in full beside the adapters: [lora] also_train = {parts:?}",
            modules.join(", ")
        ));
    }
    if let Some((_, (name, _))) = tensors.into_iter().next() {
        bail!(
            "{}: unexpected tensor `{name}` (an adapter on a part tinygpt's LoRA does not \
             cover, or of another architecture than the base's)",
            weights.display()
        );
    }
    if adapters.packed.is_empty() {
        bail!(
            "{} holds no adapter factors (lora_A, lora_B)",
            weights.display()
        );
    }
    if let Some(name) = &peft.base_model_name_or_path {
        notes.push(format!(
            "the adapter was trained on {name}; its shapes fit {}",
            base.dir.display()
        ));
    }
    write_run(adapters, base, model, out, notes)
}

/// Every block's packed adapters, before they are padded to one rank.
struct Adapters {
    /// `(layer, target) → (A [in, rank], B [rank, out])`.
    packed: BTreeMap<(usize, LoraTarget), (Matrix, Matrix)>,
    /// tinygpt's one scale: the config's `lora_alpha / r`.
    scale: f64,
    /// PEFT's `lora_dropout`: kept as `[lora] dropout` for further training.
    dropout: f64,
    /// The parts of the base saved whole (`modules_to_save`), and their tensors by Burn path.
    also_train: Vec<TrainedPart>,
    saved: Vec<NamedTensor>,
}

impl Adapters {
    /// The adapters of `family`'s modules among `tensors` (taken out of it), packed.
    fn read(
        peft: &PeftConfig,
        family: Family,
        gpt: &GptConfig,
        tensors: &mut BTreeMap<String, (String, Foreign)>,
        notes: &mut Vec<String>,
    ) -> Result<Self> {
        let scale = peft.scale(peft.r);
        let mut packed = BTreeMap::new();
        let mut stacked = false;
        for target in LoraTarget::all() {
            let Some((d_in, d_out)) = target.shape(gpt) else {
                continue;
            };
            for l in 0..gpt.n_layer {
                let mut pieces = Vec::new();
                for (module, _, cols) in family.modules(gpt, target) {
                    let key = format!("{}{module}", family.layer(l));
                    let mut take = |f: &str| tensors.remove(&format!("{key}.{f}.weight"));
                    match (take("lora_A"), take("lora_B")) {
                        (None, None) => {}
                        (Some((a_name, a)), Some((b_name, b))) => {
                            let a = Matrix::from_foreign(&a_name, a)?;
                            let b = Matrix::from_foreign(&b_name, b)?;
                            if a.cols != d_in || b.rows != cols.len() || b.cols != a.rows {
                                bail!(
                                    "the adapter of `{key}` has lora_A {}x{} and lora_B {}x{}, which do not fit the base's {d_in} inputs and {} outputs",
                                    a.rows,
                                    a.cols,
                                    b.rows,
                                    b.cols,
                                    cols.len()
                                );
                            }
                            let module_scale = (peft.scale(a.rows) / scale) as f32;
                            pieces.push((a, b, cols, module_scale));
                        }
                        _ => bail!("the adapter of `{key}` lacks one of lora_A and lora_B"),
                    }
                }
                if let Some((a, b, was_stacked)) = pack(pieces, d_in, d_out) {
                    stacked |= was_stacked;
                    packed.insert((l, target), (a, b));
                }
            }
        }
        if stacked {
            notes.push("the adapter's factors of q/k/v (or gate/up) are stacked into one adapter of tinygpt's packed matrix, of their summed rank".into());
        }
        let dropout = peft.lora_dropout;
        Ok(Self {
            packed,
            scale,
            dropout,
            also_train: Vec::new(),
            saved: Vec::new(),
        })
    }
}

/// One adapter of a packed matrix `[d_in, d_out]` computing what `pieces` do, each
/// `(lora_A [r, d_in], lora_B [cols, r], its columns, its scale relative to tinygpt's)`; `None`
/// without pieces; and whether the pieces' factors were stacked (pieces with the same
/// `lora_A` share it instead).
fn pack(
    pieces: Vec<(Matrix, Matrix, Range<usize>, f32)>,
    d_in: usize,
    d_out: usize,
) -> Option<(Matrix, Matrix, bool)> {
    let first = pieces.first()?.0.clone();
    let shared = pieces.iter().all(|(a, ..)| *a == first);
    let rank = match shared {
        true => first.rows,
        false => pieces.iter().map(|(a, ..)| a.rows).sum(),
    };
    let mut a_packed = Matrix::zeros(d_in, rank);
    let mut b_packed = Matrix::zeros(rank, d_out);
    let mut at = 0;
    for (i, (a, b, cols, scale)) in pieces.into_iter().enumerate() {
        if !shared || i == 0 {
            a.transposed().place(&mut a_packed, 0, at, 1.0);
        }
        b.transposed().place(&mut b_packed, at, cols.start, scale);
        if !shared {
            at += a.rows;
        }
    }
    Some((a_packed, b_packed, !shared))
}

/// Creates the LoRA run `out` of `base` (its model `model`) holding `adapters`, padded to
/// their largest rank.
fn write_run(
    adapters: Adapters,
    base: Run,
    model: Gpt,
    out: &Path,
    mut notes: Vec<String>,
) -> Result<Imported> {
    let rank = adapters
        .packed
        .values()
        .map(|(a, _)| a.cols)
        .max()
        .unwrap_or(0);
    let targets: Vec<LoraTarget> = LoraTarget::all()
        .filter(|t| adapters.packed.keys().any(|(_, x)| x == t))
        .collect();
    let lora = LoraConfig {
        rank,
        alpha: Some(adapters.scale * rank as f64),
        dropout: adapters.dropout,
        targets: Some(targets.clone()),
        // PEFT's adapters name no quantisation of their base.
        base: BaseWeights::F32,
        also_train: adapters.also_train,
    };
    let gpt = base.config.gpt(base.tokenizer.vocab_size());
    let mut tensors = Vec::new();
    let mut padded = false;
    for l in 0..gpt.n_layer {
        for &target in &targets {
            let (d_in, d_out) = target.shape(&gpt).unwrap_or_default();
            let (mut a, mut b) = (Matrix::zeros(d_in, rank), Matrix::zeros(rank, d_out));
            if let Some((a_in, b_in)) = adapters.packed.get(&(l, target)) {
                padded |= a_in.cols < rank;
                a_in.place(&mut a, 0, 0, 1.0);
                b_in.place(&mut b, 0, 0, 1.0);
            } else {
                padded = true;
            }
            tensors.push(a.named(adapter_path(l, target, Factor::A)));
            tensors.push(b.named(adapter_path(l, target, Factor::B)));
        }
    }
    if padded {
        notes.push(format!("adapters of a lower rank (or none, in some blocks) are padded with zeros to rank {rank}"));
    }
    tensors.extend(adapters.saved);
    let model = crate::run::adapters::attach_adapters(model, &lora, write_safetensors(&tensors)?)?;
    let (_, weights_sha256) = base.best_weights_file()?;
    let run: PathBuf = base
        .dir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", base.dir.display()))?;
    let state = TrainState {
        lora_base: Some(LoraBase {
            run,
            weights_sha256,
        }),
        ..TrainState::default()
    };
    let mut config = base.config.clone();
    config.lora = Some(lora);
    config.validate()?;
    let vocab_size = base.tokenizer.vocab_size();
    Run::create(out, config.clone(), base.tokenizer, |run| {
        run.save(Which::Best, &model, None, &state)?;
        run.save(Which::Last, &model, None, &state)
    })?;
    Ok(Imported {
        format: "PEFT LoRA adapter",
        config,
        vocab_size,
        notes,
    })
}
