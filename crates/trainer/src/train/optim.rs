//! The optimizer: nanoGPT's AdamW (decay on 2-D weights only), or Muon for the blocks'
//! matrices beside it ([`crate::train::muon`]), and the learning-rate schedule; the
//! [`Optimizer`] part every engine takes, and AdamW's state moved between Burn's optimizer
//! record and the flat form the fused and device engines keep it in.

use anyhow::{Context, Result, bail};
use burn::module::{ParamGroup, ParamId};
use burn::optim::{AdamWConfig, LearningRate, ModuleOptimizer};
use burn::tensor::{Bytes, Device, Tensor, TensorData};
use tinygpt_model::{
    AdamWSettings, Gpt, LrRatios, MomentState, ParamLayout, VelocityState, names::BlockSlot,
    names::Slot,
};

pub use super::state_pack::States;
use crate::config::{LrSchedule, OptimizerKind, RunConfig, UpdateKind};
use crate::train::muon::{Muon, MuonSettings};

/// The update rule an engine applies once it has the (clipped) gradients. Every engine matches
/// on it exhaustively, so a new rule does not compile until each engine implements it or
/// refuses it in one line.
#[derive(Debug, Clone, PartialEq)]
pub enum UpdateRule {
    /// AdamW with nanoGPT's groups: Burn's `AdamW` on the host engine, the same arithmetic on
    /// the fused engine's buffers and on the device engine's flat buffers.
    AdamW(AdamWSettings),
    /// Muon for the matrices inside the blocks and AdamW for the rest: Burn's optimizer (one
    /// more group) on the host engine, the same algorithm on the fused engine's buffers; the
    /// device engine does not run it, and
    /// [`Placement::engine_for`](crate::backend::Placement::engine_for) routes around it.
    Muon(AdamWSettings, MuonSettings),
}

impl UpdateRule {
    /// The `train.optimizer` setting this rule implements.
    pub fn kind(&self) -> OptimizerKind {
        match self {
            UpdateRule::AdamW(_) => OptimizerKind::AdamW,
            UpdateRule::Muon(..) => OptimizerKind::Muon,
        }
    }

    /// What this rule asks of an engine.
    pub fn update_kind(&self) -> UpdateKind {
        let adamw = match self {
            UpdateRule::AdamW(adamw) | UpdateRule::Muon(adamw, _) => adamw,
        };
        UpdateKind {
            optimizer: self.kind(),
            lr_groups: adamw.lr_ratios != LrRatios::default(),
            lora: false,
            lora_dropout: false,
        }
    }
}

/// What an engine takes to update the weights: the rule, and Burn's optimizer holding its state
/// (its groups and settings are what the checkpoint's `optimizer.bpk` record is written with).
pub struct Optimizer {
    pub rule: UpdateRule,
    pub burn: ModuleOptimizer,
}

impl Optimizer {
    /// The run's optimizer for `model`, its state in `burn` (a fresh [`optimizer`], or one
    /// loaded from a checkpoint with [`load_optimizer`]).
    pub fn for_run(config: &RunConfig, model: &Gpt, burn: ModuleOptimizer) -> Self {
        let adamw = adamw_settings(config, model);
        let rule = match config.train.optimizer {
            OptimizerKind::AdamW => UpdateRule::AdamW(adamw),
            OptimizerKind::Muon => UpdateRule::Muon(adamw, muon_settings(config)),
        };
        Self { rule, burn }
    }
}

/// nanoGPT's (PyTorch's) AdamW epsilon; Burn's default is 1e-5.
const ADAMW_EPSILON: f32 = 1e-8;

/// The learning rate at `step`: linear warmup to `learning_rate` over `warmup_iters`, then the
/// schedule's way down to `min_lr` at `lr_decay_iters`, then `min_lr`. `cosine` is nanoGPT's
/// `get_lr`; `wsd` holds the peak and decays in a straight line over the last
/// `decay_fraction` of `lr_decay_iters` (never before the warmup ends).
pub fn learning_rate(config: &RunConfig, step: usize) -> f64 {
    let t = &config.train;
    if step < t.warmup_iters {
        return t.learning_rate * (step + 1) as f64 / (t.warmup_iters + 1) as f64;
    }
    let decay = config.lr_decay_iters();
    if step >= decay {
        return t.min_lr;
    }
    let span = |start: usize| (step - start) as f64 / (decay - start).max(1) as f64;
    match t.lr_schedule {
        LrSchedule::Cosine => {
            let ratio = span(t.warmup_iters);
            t.min_lr
                + 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos()) * (t.learning_rate - t.min_lr)
        }
        LrSchedule::Wsd => {
            let decaying = (t.decay_fraction * decay as f64).round() as usize;
            let start = decay.saturating_sub(decaying).max(t.warmup_iters);
            match step < start {
                true => t.learning_rate,
                false => t.learning_rate + (t.min_lr - t.learning_rate) * span(start),
            }
        }
    }
}

/// AdamW's settings for `model` under `config`: betas, epsilon, and which parameters decay.
pub(crate) fn adamw_settings(config: &RunConfig, model: &Gpt) -> AdamWSettings {
    let t = &config.train;
    AdamWSettings {
        beta_1: t.beta1 as f32,
        beta_2: t.beta2 as f32,
        epsilon: ADAMW_EPSILON,
        weight_decay: t.weight_decay as f32,
        decayed: model.decayed_param_ids(),
        lr_ratios: lr_ratios(config),
    }
}

/// Each group's learning rate over the schedule's, as `[train]` sets them.
pub(crate) fn lr_ratios(config: &RunConfig) -> LrRatios {
    LrRatios {
        embedding: config.train.embedding_lr_ratio,
        head: config.train.head_lr_ratio,
    }
}

/// Burn's optimizer `O` at `ratio` times the learning rate it is given: a group of parameters
/// with a rate of its own ([`LrRatios`]). Its state is `O`'s, saved under the same names.
#[derive(Clone)]
struct Scaled<O> {
    inner: O,
    ratio: f64,
}

impl<O: burn::optim::Optimizer> burn::optim::Optimizer for Scaled<O> {
    type State<const D: usize> = O::State<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        self.inner.step(lr * self.ratio, tensor, grad, state)
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        O::to_device(state, device)
    }
}

/// Muon's settings under `config`.
pub(crate) fn muon_settings(config: &RunConfig) -> MuonSettings {
    let t = &config.train;
    MuonSettings {
        lr_ratio: t.muon_learning_rate / t.learning_rate,
        momentum: t.muon_momentum,
        momentum_start: t.muon_momentum_start,
        warmup: t.muon_momentum_warmup,
        weight_decay: t.muon_weight_decay,
    }
}

/// Whether Muon updates `slot`: the 2-D matrices inside the blocks (the attention's and the
/// MLP's projections, or their LoRA adapters' factors), never the embeddings, the head, gains
/// or biases.
fn muon_updates(slot: Slot) -> bool {
    match slot {
        Slot::Block(_, slot) => match slot {
            BlockSlot::AttnWeight
            | BlockSlot::AttnProjWeight
            | BlockSlot::FcWeight
            | BlockSlot::MlpProjWeight => true,
            BlockSlot::Ln1Gain
            | BlockSlot::Ln1Bias
            | BlockSlot::AttnBias
            | BlockSlot::AttnProjBias
            | BlockSlot::Ln2Gain
            | BlockSlot::Ln2Bias
            | BlockSlot::FcBias
            | BlockSlot::MlpProjBias => false,
        },
        Slot::TokenEmbedding
        | Slot::PositionEmbedding
        | Slot::BigramEmbedding
        | Slot::FinalNormGain
        | Slot::FinalNormBias
        | Slot::LmHead => false,
        Slot::Adapter { .. } => true,
    }
}

/// The ids of the parameters Muon updates ([`muon_updates`]).
pub(crate) fn muon_ids(model: &Gpt) -> Vec<ParamId> {
    let layout = ParamLayout::of(model);
    layout
        .entries()
        .iter()
        .filter(|e| layout.trains(e) && muon_updates(e.slot))
        .map(|e| e.id)
        .collect()
}

/// Burn's AdamW with nanoGPT's two groups ([`adamw_settings`]): weight decay on 2-D weights,
/// none on biases and gains; a group more for each set of parameters whose learning rate is not
/// the schedule's ([`LrRatios`]: none by default); with `optimizer = "muon"`, one more, the
/// blocks' matrices ([`muon_ids`]), under [`Muon`]. Groups are by parameter id, so a record
/// written from the fused engine's buffers (which names ids, not paths) routes each state to its
/// group.
pub fn optimizer(config: &RunConfig, model: &Gpt) -> ModuleOptimizer {
    let s = adamw_settings(config, model);
    let adamw = |weight_decay: f32| {
        AdamWConfig::new()
            .with_beta_1(s.beta_1)
            .with_beta_2(s.beta_2)
            .with_epsilon(s.epsilon)
            .with_weight_decay(weight_decay)
    };
    let undecayed: Vec<ParamId> = crate::run::weights::param_ids(model)
        .into_iter()
        .map(ParamId::from)
        .filter(|id| !s.decayed.contains(id))
        .collect();
    let mut optim = adamw(s.weight_decay).init().with_group(
        ParamGroup::from_ids(undecayed),
        adamw(0.0).build(),
        None,
    );
    for (ratio, ids) in lr_groups(&s.lr_ratios, model) {
        for decayed in [true, false] {
            let weight_decay = if decayed { s.weight_decay } else { 0.0 };
            let members = ids.iter().filter(|id| s.decayed.contains(id) == decayed);
            let group = ParamGroup::from_ids(members.copied().collect());
            let inner = adamw(weight_decay).build();
            optim = optim.with_group(group, Scaled { inner, ratio }, None);
        }
    }
    match config.train.optimizer {
        OptimizerKind::AdamW => optim,
        OptimizerKind::Muon => {
            let muon = Muon {
                settings: muon_settings(config),
            };
            optim.with_group(ParamGroup::from_ids(muon_ids(model)), muon, None)
        }
    }
}

/// The parameters of each learning rate other than the schedule's, by ratio.
fn lr_groups(ratios: &LrRatios, model: &Gpt) -> Vec<(f64, Vec<ParamId>)> {
    let mut groups: Vec<(f64, Vec<ParamId>)> = Vec::new();
    for entry in ParamLayout::of(model).entries() {
        let ratio = ratios.of(entry.slot);
        if ratio == 1.0 {
            continue;
        }
        match groups.iter_mut().find(|(r, _)| *r == ratio) {
            Some((_, ids)) => ids.push(entry.id),
            None => groups.push((ratio, vec![entry.id])),
        }
    }
    groups
}

/// `optim`'s record as a checkpoint's `optimizer.bpk` holds it.
pub(crate) fn record_bytes(optim: &ModuleOptimizer) -> Result<Vec<u8>> {
    let bytes = optim
        .into_bytes()
        .map_err(|e| anyhow::anyhow!("cannot serialise the optimizer state: {e:?}"))?;
    Ok(bytes.to_vec())
}

/// [`optimizer`] holding the state saved in `bytes` (a checkpoint's `optimizer.bpk`).
pub fn load_optimizer(config: &RunConfig, model: &Gpt, bytes: Vec<u8>) -> Result<ModuleOptimizer> {
    optimizer(config, model)
        .from_bytes(Bytes::from_bytes_vec(bytes))
        .map_err(|e| anyhow::anyhow!("{e:?}"))
}

/// The state in `optim` (Burn's, e.g. loaded from a checkpoint), read from Burn's own
/// serialisation: AdamW's `{id}.momentum.moment_1`, `.moment_2` and the scalar
/// `{id}.momentum.time`; Muon's `{id}.velocity` and the scalar `{id}.step`
/// ([`crate::train::muon::MuonState`]). Empty before the first step.
pub(crate) fn states_from_burn(optim: &ModuleOptimizer) -> Result<States> {
    let bytes = optim
        .into_bytes()
        .map_err(|e| anyhow::anyhow!("cannot serialise the optimizer state: {e:?}"))?;
    let reader = burn_pack::Reader::from_bytes(bytes)?;
    let scalars = reader.scalars().clone();
    let scalar = |key: String| -> Result<u64> {
        let value = scalars.get(&key).copied();
        let value = value.with_context(|| format!("the optimizer state has no {key}"))?;
        u64::try_from(value).map_err(|e| anyhow::anyhow!("{key}: {e:?}"))
    };
    let mut moments: std::collections::BTreeMap<u64, MomentState> = Default::default();
    let mut muon = Vec::new();
    for tensor in reader.into_tensors()? {
        let (name, dtype, shape, param_id, bytes) = tensor.into_parts()?;
        let id = param_id.context("an optimizer tensor without a parameter id")?;
        let data = TensorData::from_bytes(bytes, shape, dtype);
        let shape = data.shape().to_vec();
        let values = data
            .try_to_vec::<f32>()
            .map_err(|e| anyhow::anyhow!("optimizer tensor {name}: {e:?}"))?;
        let leaf = name.rsplit('.').next();
        if leaf == Some("velocity") {
            muon.push(VelocityState {
                id: ParamId::from(id),
                shape,
                step: scalar(format!("{id}.step"))?,
                velocity: values,
            });
            continue;
        }
        let time = usize::try_from(scalar(format!("{id}.momentum.time"))?)?;
        let state = moments.entry(id).or_insert_with(|| MomentState {
            id: ParamId::from(id),
            shape,
            time,
            moment_1: Vec::new(),
            moment_2: Vec::new(),
        });
        match leaf {
            Some("moment_1") => state.moment_1 = values,
            Some("moment_2") => state.moment_2 = values,
            _ => anyhow::bail!("unexpected optimizer tensor {name} (not AdamW's or Muon's state)"),
        }
    }
    Ok(States {
        adamw: moments.into_values().collect(),
        muon,
    })
}

/// AdamW's state in `optim` (see [`states_from_burn`]); Muon's there is an error.
pub(crate) fn moments_from_burn(optim: &ModuleOptimizer) -> Result<Vec<MomentState>> {
    let states = states_from_burn(optim)?;
    if !states.muon.is_empty() {
        bail!("the optimizer state holds Muon's momentum where only AdamW's was expected");
    }
    Ok(states.adamw)
}

/// `template` (the run's optimizer: its groups and settings) holding `states`, through Burn's
/// serialisation, the names [`states_from_burn`] reads.
pub(crate) fn burn_from_states(
    template: &ModuleOptimizer,
    states: States,
) -> Result<ModuleOptimizer> {
    let bytes = Bytes::from_bytes_vec(super::state_pack::states_pack(states)?);
    template
        .clone()
        .from_bytes(bytes)
        .map_err(|e| anyhow::anyhow!("cannot load the optimizer state: {e:?}"))
}

/// [`burn_from_states`] with AdamW's state only.
pub(crate) fn burn_from_moments(
    template: &ModuleOptimizer,
    states: Vec<MomentState>,
) -> Result<ModuleOptimizer> {
    let adamw = states;
    burn_from_states(
        template,
        States {
            adamw,
            muon: Vec::new(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::presets::ConfigSource;

    fn config(overrides: &[&str]) -> RunConfig {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        ConfigSource::Preset("baby").load(&overrides).unwrap()
    }

    /// 1000 steps, warmup 100, peak 1e-3, floor 1e-4, the last 20% decaying: the warmup is the
    /// cosine's, then the peak holds to step 800 and falls in a straight line to the floor at
    /// step 1000, never rising.
    #[test]
    fn wsd_warms_up_holds_then_decays_linearly() {
        let base = [
            "train.max_iters=1000",
            "train.lr_decay_iters=1000",
            "train.warmup_iters=100",
            "train.learning_rate=1e-3",
            "train.min_lr=1e-4",
        ];
        let cosine = config(&base);
        let wsd = config(&[&base[..], &["train.lr_schedule=\"wsd\""]].concat());
        let lr = |step| learning_rate(&wsd, step);
        for step in [0, 50, 99] {
            assert_eq!(lr(step), learning_rate(&cosine, step));
        }
        for step in [100, 400, 799, 800] {
            assert_eq!(lr(step), 1e-3, "step {step}");
        }
        assert!((lr(900) - 5.5e-4).abs() < 1e-12, "halfway: {}", lr(900));
        assert_eq!(lr(1000), 1e-4);
        assert_eq!(lr(5000), 1e-4);
        assert!((100..1000).all(|s| lr(s + 1) <= lr(s)));
        // The whole run decaying: a straight line from the end of the warmup.
        let all = config(
            &[
                &base[..],
                &["train.lr_schedule=\"wsd\"", "train.decay_fraction=1.0"],
            ]
            .concat(),
        );
        assert_eq!(learning_rate(&all, 100), 1e-3);
        assert!((learning_rate(&all, 550) - 5.5e-4).abs() < 1e-12);
    }

    #[test]
    fn the_decay_fraction_is_checked() {
        for bad in ["0.0", "1.5", "-0.2", "nan"] {
            let overrides = vec![format!("train.decay_fraction={bad}")];
            let err = ConfigSource::Preset("baby").load(&overrides).unwrap_err();
            assert!(
                format!("{err:#}").contains("train.decay_fraction"),
                "{err:#}"
            );
        }
        let overrides = vec!["train.lr_schedule=\"linear\"".to_string()];
        let err = ConfigSource::Preset("baby").load(&overrides).unwrap_err();
        assert!(format!("{err:#}").contains("lr_schedule"), "{err:#}");
    }
}
