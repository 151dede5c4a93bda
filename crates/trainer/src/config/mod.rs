//! The run configuration: one TOML file with `[model]`, `[data]`, `[train]` and `[chat]` sections.
//!
//! Every key has a documented default, unknown keys are errors, and `--set section.key=value`
//! overrides a key before validation, so every error names the key at fault.

pub mod presets;
mod validate;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tinygpt_attention::AttentionKernel;
use tinygpt_model::{GptConfig, LoraConfig};

use crate::chat::ChatSection;
use crate::data::tokenizer::TokenizerKind;

/// The name by which configs refer to the corpus built into the binary ([`presets`] holds it).
pub(crate) const BUILTIN_CORPUS: &str = "builtin:paradise-lost.txt";

/// A whole run: architecture, data and optimisation.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// `[model]`: the architecture, the model crate's own type (defaults: nanoGPT's CPU "baby"
    /// model; `vocab_size` left out = the tokenizer's).
    pub model: GptConfig,
    pub data: DataSection,
    pub train: TrainSection,
    /// `[chat]`: the model's chat template (written only when it has one).
    #[serde(skip_serializing_if = "ChatSection::is_default")]
    pub chat: ChatSection,
    /// `[lora]`: train LoRA adapters on a frozen base (`train --init-from RUN --lora RANK`);
    /// absent: every parameter trains.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
}

/// `[data]`: how text becomes training samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataSection {
    /// The corpus (`--data` overrides it): UTF-8 text, a prepared directory, `.jsonl`
    /// conversations, or `builtin:paradise-lost.txt`, the copy of Paradise Lost inside the
    /// binary.
    pub path: PathBuf,
    /// "char" (one token per distinct character, nanoGPT's ids) or "bpe" (byte-level BPE).
    pub tokenizer: TokenizerKind,
    /// Vocabulary size the BPE tokenizer is trained to (ignored for "char").
    pub bpe_vocab_size: usize,
    /// "packed": random windows of the token stream (nanoGPT); "documents": one sample per
    /// document, padded to the batch, padded targets ignored by the loss.
    pub batching: Batching,
    /// What separates documents for "documents" batching.
    pub separator: String,
    /// Share of the corpus (its end) held out for validation.
    pub val_fraction: f64,
}

impl Default for DataSection {
    fn default() -> Self {
        Self {
            path: PathBuf::from(BUILTIN_CORPUS),
            tokenizer: TokenizerKind::Char,
            bpe_vocab_size: 512,
            batching: Batching::Packed,
            separator: "\n\n".into(),
            val_fraction: 0.1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Batching {
    Packed,
    Documents,
}

/// How the learning rate moves over a run (`train.lr_schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LrSchedule {
    /// nanoGPT's: linear warmup, then a cosine from `learning_rate` down to `min_lr` at
    /// `lr_decay_iters`.
    #[default]
    Cosine,
    /// Warmup-stable-decay (nanochat's and modded-nanogpt's): linear warmup, `learning_rate`
    /// held, then a straight line down to `min_lr` over the last `decay_fraction` of
    /// `lr_decay_iters`. Holding the peak longer trains faster; the short decay at the end
    /// takes the loss down to what a cosine reaches.
    Wsd,
}

/// What updates the weights (`train.optimizer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// nanoGPT's AdamW for every parameter (weight decay on 2-D weights only).
    #[default]
    AdamW,
    /// Muon for the matrices inside the blocks, AdamW for the embeddings, the head, the gains
    /// and the biases (nanochat's and modded-nanogpt's split); see `train::muon`.
    Muon,
}

/// What a run's update asks of an engine: its optimizer, whether a group of parameters
/// learns at a rate of its own (`train.embedding_lr_ratio`, `train.head_lr_ratio` not 1), and
/// whether only LoRA adapters train (`[lora]`), their inputs dropped out (`[lora] dropout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UpdateKind {
    pub optimizer: OptimizerKind,
    pub lr_groups: bool,
    pub lora: bool,
    pub lora_dropout: bool,
}

impl From<OptimizerKind> for UpdateKind {
    fn from(optimizer: OptimizerKind) -> Self {
        Self {
            optimizer,
            lr_groups: false,
            lora: false,
            lora_dropout: false,
        }
    }
}

impl UpdateKind {
    /// The update `config` asks for.
    pub fn of(config: &RunConfig) -> Self {
        let train = &config.train;
        Self {
            optimizer: train.optimizer,
            lr_groups: train.embedding_lr_ratio != 1.0 || train.head_lr_ratio != 1.0,
            lora: config.lora.is_some(),
            lora_dropout: config.lora.as_ref().is_some_and(|lora| lora.dropout > 0.0),
        }
    }
}

/// The precision a training step computes in (`train.dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainDType {
    /// Everything in f32.
    #[default]
    F32,
    /// Mixed precision: matmuls and the activations between them in bfloat16; weights, AdamW's
    /// moments, the residual stream, LayerNorms, the softmax and the loss in f32.
    Bf16,
    /// As `bf16` in float16, with dynamic loss scaling (f16's range is too narrow for small
    /// gradients): for GPUs without bf16.
    F16,
}

impl TrainDType {
    /// The name as TOML spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
        }
    }

    /// The dtype the matmuls run in.
    pub fn float(self) -> burn::tensor::FloatDType {
        match self {
            Self::F32 => burn::tensor::FloatDType::F32,
            Self::Bf16 => burn::tensor::FloatDType::BF16,
            Self::F16 => burn::tensor::FloatDType::F16,
        }
    }
}

/// `[train]`: AdamW, the learning-rate schedule, evaluation and logging.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Sequences per micro-batch.
    pub batch_size: usize,
    /// Micro-batches whose gradients are averaged into one optimizer step.
    pub grad_accum: usize,
    /// Optimizer steps.
    pub max_iters: usize,
    /// Peak learning rate, reached after `warmup_iters`.
    pub learning_rate: f64,
    /// Learning rate at the end of the cosine decay.
    pub min_lr: f64,
    pub warmup_iters: usize,
    /// Step where the decay reaches `min_lr`; 0 = `max_iters`.
    pub lr_decay_iters: usize,
    /// "cosine" (nanoGPT's) or "wsd" (warmup, stable, linear decay): see [`LrSchedule`].
    pub lr_schedule: LrSchedule,
    /// With `wsd`: the fraction of `lr_decay_iters` at the end spent decaying, in (0, 1].
    pub decay_fraction: f64,
    pub beta1: f64,
    pub beta2: f64,
    /// AdamW weight decay, on 2-D weights only.
    pub weight_decay: f64,
    /// The embeddings' learning rate (the token, position and bigram tables) over
    /// `learning_rate`: nanochat's embeddings learn far faster than its matrices. 1.
    pub embedding_lr_ratio: f64,
    /// The untied head's learning rate over `learning_rate` (nanochat's learns slower). 1.
    pub head_lr_ratio: f64,
    /// "adamw" (nanoGPT's, the default) or "muon": see [`OptimizerKind`].
    pub optimizer: OptimizerKind,
    /// With `muon`: the blocks' matrices' peak learning rate (the schedule scales it as it
    /// scales `learning_rate`). nanochat's 0.02.
    pub muon_learning_rate: f64,
    /// With `muon`: Nesterov momentum, warmed up from `muon_momentum_start` over
    /// `muon_momentum_warmup` steps (nanochat: 0.85 → 0.95 over 300).
    pub muon_momentum: f64,
    pub muon_momentum_start: f64,
    pub muon_momentum_warmup: usize,
    /// With `muon`: decoupled weight decay of the matrices, at Muon's learning rate; 0.
    pub muon_weight_decay: f64,
    /// Clip the global gradient norm (all parameters together) to this; 0 = off.
    pub grad_clip: f64,
    /// A step whose loss or gradient norm is NaN or infinite skips its update; after this many
    /// such steps in a row, training stops with an error (the last checkpoint stays as it was).
    pub nonfinite_limit: usize,
    /// Evaluate train and val loss every this many steps (and at the end).
    pub eval_interval: usize,
    /// Batches per loss estimate.
    pub eval_iters: usize,
    /// Print a log line every this many steps when stdout is not a terminal.
    pub log_interval: usize,
    /// Seeds the initial weights, the batches and dropout.
    pub seed: u64,
    /// Threads of the fused CPU engine's training steps and loss estimates, and of the loss
    /// estimates on Burn's CPU backends; 0 = one per core. The same seed and the same `threads`
    /// give the same numbers.
    pub threads: usize,
    /// The prompt each evaluation samples from and records the attention of (in
    /// `evals.jsonl`, for `tinygpt watch`): up to 32 tokens; empty = the start of the
    /// validation split.
    pub sample_prompt: String,
    /// Tokens sampled at each evaluation (seeded by `seed`); 0 = none.
    pub sample_tokens: usize,
    /// "f32", "bf16" or "f16": the precision of the training step's matmuls (see
    /// [`TrainDType`]); checkpoints are f32 whatever it is.
    pub dtype: TrainDType,
    /// Activation checkpointing: keep each block's input only and recompute its activations
    /// in the backward pass, for far less memory at about a third more time per step; the
    /// same gradients. false.
    pub checkpointing: bool,
    /// How Burn's backends compute attention, in training and sampling: "auto", "explicit",
    /// "sdpa" or "flash" (see [`AttentionKernel`]); the same numbers either way. How, not
    /// what: older configs said `model.kernel`, which is read as this.
    pub attention_kernel: AttentionKernel,
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            batch_size: 12,
            grad_accum: 1,
            max_iters: 2000,
            learning_rate: 1e-3,
            min_lr: 1e-4,
            warmup_iters: 100,
            lr_decay_iters: 0,
            lr_schedule: LrSchedule::Cosine,
            // nanochat's warmdown ratio.
            decay_fraction: 0.2,
            beta1: 0.9,
            beta2: 0.99,
            weight_decay: 0.1,
            embedding_lr_ratio: 1.0,
            head_lr_ratio: 1.0,
            optimizer: OptimizerKind::AdamW,
            muon_learning_rate: 0.02,
            muon_momentum: 0.95,
            muon_momentum_start: 0.85,
            muon_momentum_warmup: 300,
            muon_weight_decay: 0.0,
            grad_clip: 1.0,
            nonfinite_limit: 5,
            eval_interval: 250,
            eval_iters: 20,
            log_interval: 10,
            seed: 1337,
            threads: 0,
            sample_prompt: String::new(),
            sample_tokens: 100,
            dtype: TrainDType::F32,
            checkpointing: false,
            attention_kernel: AttentionKernel::Auto,
        }
    }
}

impl RunConfig {
    /// Reads `path` and applies `overrides` (`section.key=value`, the value in TOML syntax or a
    /// bare string), then validates.
    pub fn load(path: Option<&Path>, overrides: &[String]) -> Result<Self> {
        let text = match path {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config {}", path.display()))?,
            None => String::new(),
        };
        Self::load_str(&text, overrides).with_context(|| match path {
            Some(path) => format!("config {}", path.display()),
            None => "config".to_string(),
        })
    }

    /// [`load`](Self::load) from TOML text.
    pub fn load_str(text: &str, overrides: &[String]) -> Result<Self> {
        let mut table = text
            .parse::<toml::Table>()
            .map_err(|e| anyhow::anyhow!("{}", one_line(&e.to_string())))?;
        for assignment in overrides {
            apply_override(&mut table, assignment)?;
        }
        move_older_keys(&mut table);
        if let Some(lora) = table.get("lora").and_then(|l| l.as_table())
            && !lora.contains_key("rank")
        {
            bail!(
                "[lora] has no rank: LoRA adapters (and --weights, --also-train beside them) \
                 need --lora RANK or lora.rank"
            );
        }
        // Through the text, so that an error quotes the line at fault.
        let text = toml::to_string(&table)?;
        let config: RunConfig =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}", one_line(&e.to_string())))?;
        config.validate()?;
        Ok(config)
    }

    /// Parses a config written by [`to_toml`](Self::to_toml) (a checkpoint's `config.toml`).
    pub(crate) fn from_toml(text: &str) -> Result<Self> {
        Self::load_str(text, &[])
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a RunConfig always serialises")
    }

    /// The model for a tokenizer of `tokens` ids: `model.vocab_size` rows when it pads the
    /// vocabulary, else `tokens` ([`RunConfig::check_vocab`] refuses a padding too small).
    pub fn gpt(&self, tokens: usize) -> GptConfig {
        self.model.for_vocabulary(tokens)
    }

    /// Checks that the model's vocabulary holds a tokenizer of `tokens` ids.
    pub fn check_vocab(&self, tokens: usize) -> Result<()> {
        self.model
            .check_vocabulary(tokens)
            .map_err(|e| anyhow::anyhow!("invalid [model]: {e}"))
    }

    /// Threads for the loss estimates: `train.threads`, or one per core.
    pub fn workers(&self) -> usize {
        match self.train.threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }

    /// The step where the decay ends.
    pub fn lr_decay_iters(&self) -> usize {
        match self.train.lr_decay_iters {
            0 => self.train.max_iters,
            n => n,
        }
    }
}

/// Keys that moved, read where they now live: `model.kernel` (how attention is computed, not
/// the architecture) is `train.attention_kernel`. The older key, when given, wins: a config
/// written since never has it, so it comes from an older file or a `--set`.
fn move_older_keys(table: &mut toml::Table) {
    let kernel = table
        .get_mut("model")
        .and_then(toml::Value::as_table_mut)
        .and_then(|model| model.remove("kernel"));
    if let Some(kernel) = kernel {
        let train = table
            .entry("train")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let Some(train) = train.as_table_mut() {
            train.insert("attention_kernel".into(), kernel);
        }
    }
}

/// `section.key=value` into `table`. The value is parsed as TOML (`3`, `0.1`, `true`, `"x"`);
/// anything that does not parse is taken as a bare string (`data.tokenizer=bpe`).
fn apply_override(table: &mut toml::Table, assignment: &str) -> Result<()> {
    let Some((key, raw)) = assignment.split_once('=') else {
        bail!("--set expects section.key=value, got `{assignment}`");
    };
    let key = key.trim();
    let Some((section, field)) = key.split_once('.') else {
        bail!("--set key `{key}` must be section.key (model., data., train., chat. or lora.)");
    };
    if !matches!(section, "model" | "data" | "train" | "chat" | "lora") {
        bail!(
            "--set key `{key}`: unknown section `{section}` (expected model, data, train, chat \
             or lora)"
        );
    }
    let raw = raw.trim();
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let section = table
        .entry(section)
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let Some(section) = section.as_table_mut() else {
        bail!(
            "config key `{}` must be a table",
            key.split('.').next().unwrap_or(key)
        );
    };
    section.insert(field.to_string(), value);
    Ok(())
}

/// TOML errors span several lines (position, source excerpt, caret, message); keep the
/// offending source line and the message on one line: "`batch_size = -1`: invalid value ...".
fn one_line(message: &str) -> String {
    let mut source = None;
    let mut text = Vec::new();
    for line in message.lines().skip(1) {
        let trimmed = line.trim();
        if let Some((number, code)) = trimmed.split_once('|') {
            let number = number.trim();
            if !number.is_empty() && number.chars().all(|c| c.is_ascii_digit()) {
                source = Some(code.trim().to_string());
            }
        } else if !trimmed.is_empty() {
            text.push(trimmed);
        }
    }
    match source {
        Some(code) => format!("`{code}`: {}", text.join(" ")),
        None => text.join(" "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_baby_config_and_round_trip() {
        let config = RunConfig::default();
        assert_eq!(config.gpt(65), GptConfig::baby(65));
        assert_eq!(RunConfig::from_toml(&config.to_toml()).unwrap(), config);
    }

    #[test]
    fn overrides_apply_and_errors_name_the_key() {
        let config = RunConfig::load(
            None,
            &["train.max_iters=7".into(), "data.tokenizer=bpe".into()],
        )
        .unwrap();
        assert_eq!(config.train.max_iters, 7);
        assert_eq!(config.data.tokenizer, TokenizerKind::Bpe);

        let err = RunConfig::load(None, &["train.max_iterz=7".into()]).unwrap_err();
        assert!(format!("{err:#}").contains("max_iterz"), "{err:#}");
        let err = RunConfig::load(None, &["model.n_head=3".into()]).unwrap_err();
        assert!(format!("{err:#}").contains("n_head"), "{err:#}");
        let err = RunConfig::load(None, &["train.beta2=1.5".into()]).unwrap_err();
        assert!(format!("{err:#}").contains("train.beta2"), "{err:#}");
        let err = RunConfig::load(None, &["train.batch_size=-1".into()]).unwrap_err();
        assert!(format!("{err:#}").contains("batch_size"), "{err:#}");
        let err = RunConfig::load(None, &["nonsense".into()]).unwrap_err();
        assert!(format!("{err:#}").contains("section.key=value"), "{err:#}");
        assert!(!format!("{err:#}").contains('\n'));
    }

    /// `model.kernel` moved to `train.attention_kernel`: configs and run directories that say
    /// it still load, with the same meaning, and a `--set` of the older key overrides; what is
    /// written since names only the new key.
    #[test]
    fn the_attention_kernel_is_read_from_its_older_key() {
        let old = "[model]\nn_layer = 2\nkernel = \"flash\"\n";
        let config = RunConfig::load_str(old, &[]).unwrap();
        assert_eq!(config.train.attention_kernel, AttentionKernel::Flash);
        assert_eq!(config.model.n_layer, 2);
        let written = config.to_toml();
        assert!(
            written.contains("attention_kernel = \"flash\""),
            "{written}"
        );
        assert!(!written.contains("\nkernel"), "{written}");
        let set = RunConfig::load_str(&written, &["model.kernel=explicit".into()]).unwrap();
        assert_eq!(set.train.attention_kernel, AttentionKernel::Explicit);
        let set = RunConfig::load_str("", &["train.attention_kernel=sdpa".into()]).unwrap();
        assert_eq!(set.train.attention_kernel, AttentionKernel::Sdpa);
        let err = RunConfig::load_str(old, &["model.kernel=fast".into()]).unwrap_err();
        assert!(format!("{err:#}").contains("fast"), "{err:#}");
    }
}
