//! One stream's decode step captured once and replayed for every token: on CUDA one graph launch in place
//! of the step's few hundred kernel launches; on other backends the step simply runs again
//! ([`capture`]).
//!
//! A replay reruns the recorded launches on the buffers the recording used, so everything a
//! token changes lives in fixed device buffers that the host refreshes in place before each
//! replay: the token, its position and the sampler's draw ([`Inputs`]). The rest the step
//! derives on the device from them ([`Gpt::forward_step`]): the mask, the rotation, the cache
//! row it writes (in place, into the caches every other feed of the decoder also writes). The
//! pick's settings (temperature, top-k) are in the recorded launches: another pick records again.

use std::cell::RefCell;
use std::rc::Rc;

use burn::tensor::{Int, Tensor, TensorData};
use tinygpt_attention::{KvCache, StepAt, StepTables};

use super::forward::Ids;
use super::graph::{DeviceGraph, capture};
use crate::error::ModelError;
use crate::nn::gpt::Gpt;
use crate::sample::{Pick, Picked, Replay};

/// A token a stream's step feeds: the token, the one before it (`None`: the first of its
/// context), and its position.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fed {
    pub token: u32,
    pub before: Option<u32>,
    pub position: usize,
}

/// The buffers a replay reads.
struct Inputs {
    /// `[1, 1]`: the token fed, and with a bigram table its pair.
    ids: Ids,
    /// `[1]`: its position.
    position: Tensor<1, Int>,
    /// `[1]`: the draw in `[0, 1)`.
    uniform: Tensor<1>,
    /// The position on the host: a backend without graphs runs the step again, which checks it.
    host: usize,
}

/// The step, as the closure [`capture`] records.
type Step<'a> = Box<dyn FnMut() -> Tensor<1> + 'a>;

/// One stream's decode step with its pick, recorded.
pub(crate) struct CapturedStep<'a> {
    gpt: &'a Gpt,
    graph: DeviceGraph<Tensor<1>, Step<'a>>,
    inputs: Rc<RefCell<Inputs>>,
    /// The pick it was recorded for (the draw aside).
    pick: Pick,
}

impl<'a> CapturedStep<'a> {
    /// Records `gpt`'s step over `caches` (fixed, one sequence) and `pick`'s rule, for `fed`.
    /// Recording runs the step a few times at that position (warm-up): each run writes the
    /// same cache row with the same key and value. Nothing is computed for the caller until
    /// [`step`](Self::step).
    pub(crate) fn capture(
        gpt: &'a Gpt,
        tables: StepTables,
        caches: Rc<RefCell<Vec<KvCache>>>,
        fed: Fed,
        pick: &Pick,
    ) -> Result<Self, ModelError> {
        let device = gpt.wte.weight.device();
        let position = fed.position;
        let inputs = Rc::new(RefCell::new(Inputs {
            ids: gpt.ids(&[fed.token], &[fed.before], [1, 1]),
            position: Tensor::from_data(TensorData::new(vec![position as i64], [1]), &device),
            uniform: Tensor::from_data(TensorData::new(vec![pick.uniform as f32], [1]), &device),
            host: position,
        }));
        // The step's checks run here, outside the recording, where an error is a value.
        StepAt::new(&tables, &[position])?;
        let (vocab, rule, read) = (gpt.vocab_size(), *pick, inputs.clone());
        let step: Step<'a> = Box::new(move || {
            let inputs = read.borrow();
            let at = StepAt::on_device(&tables, inputs.position.clone(), &[inputs.host])
                .expect("a position checked before the step");
            let logits = gpt
                .forward_step(inputs.ids.clone(), &at, &mut caches.borrow_mut())
                .expect("a step checked before it was recorded");
            rule.on_device_unread(logits.reshape([vocab]), Some(inputs.uniform.clone()))
        });
        Ok(Self {
            gpt,
            graph: capture(&device, step),
            inputs,
            pick: *pick,
        })
    }

    /// Whether it replays as one graph, and if not, why.
    pub(crate) fn replays(&self) -> &Replay {
        self.graph.replays()
    }

    /// Whether this recording picks as `pick` does (its draw aside).
    pub(crate) fn picks_like(&self, pick: &Pick) -> bool {
        let settings = |p: &Pick| (p.temperature.to_bits(), p.top_k, p.vocab);
        settings(&self.pick) == settings(pick)
    }

    /// `fed` (its position below the caches' capacity, checked by the caller) picked with
    /// `pick`'s draw: the inputs written in place, one replay, one read. `caches` are the
    /// recorded ones, which learn their new length here.
    pub(crate) fn step(&mut self, fed: Fed, pick: &Pick, caches: &RefCell<Vec<KvCache>>) -> Picked {
        let position = fed.position;
        {
            let mut inputs = self.inputs.borrow_mut();
            refill_ids(&mut inputs.ids, self.gpt, &[fed.token], &[fed.before]);
            refill(&mut inputs.position, vec![position as i64]);
            refill(&mut inputs.uniform, vec![pick.uniform as f32]);
            inputs.host = position;
        }
        // Safety: every buffer the recording touched is alive (the inputs and caches behind
        // their `Rc`s, the model's parameters borrowed for 'a), and the refreshes above and the
        // read below are issued from this thread, on the stream the graph was recorded on.
        let out = unsafe { self.graph.replay() }.clone();
        for cache in caches.borrow_mut().iter_mut() {
            cache.mark_written(position + 1);
        }
        Pick::read(out)
    }
}

/// Writes `tokens` (each after its `before`) into `ids`, a recorded step's input, in place.
pub(super) fn refill_ids(ids: &mut Ids, gpt: &Gpt, tokens: &[u32], before: &[Option<u32>]) {
    refill(&mut ids.tokens, tokens.iter().map(|&t| t as i64).collect());
    if let (Some(pairs), Some(values)) = (&mut ids.pairs, gpt.pair_ids(tokens, before)) {
        refill(pairs, values);
    }
}

/// Writes `values` into `buffer`, a recorded step's input, in place: the buffer is taken out and
/// held alone, so the write lands in it and not in a copy (a replay reads that buffer).
pub(super) fn refill<const D: usize, K, E>(buffer: &mut Tensor<D, K>, values: Vec<E>)
where
    K: burn::tensor::kind::Basic,
    E: burn::tensor::Element,
{
    let device = buffer.device();
    let dims = buffer.dims();
    let fresh = Tensor::<D, K>::from_data(TensorData::new(values, dims), &device);
    let whole = dims.map(|d| 0..d);
    *buffer = buffer.extract().slice_assign(whole, fresh);
}
