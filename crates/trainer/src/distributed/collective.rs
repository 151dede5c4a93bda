//! What the ranks of one run do together ([`Collective`]: all-reduce, broadcast, abort), and
//! [`Ranks`], the handle the trainer and its engine hold.

use std::fmt;
use std::rc::Rc;

use anyhow::Result;
use tinygpt_model::GradientSum;

/// What the ranks of one run do together. Every rank makes the same calls in the same order;
/// a call returns when every rank has made it.
pub trait Collective {
    /// This process's rank, `0..size`.
    fn rank(&self) -> usize;
    /// How many ranks train the run.
    fn size(&self) -> usize;
    /// Ranks on this host (threads are shared among them).
    fn local_size(&self) -> usize;
    /// This rank's place among them, `0..local_size`: which of the host's GPUs it takes.
    fn local_rank(&self) -> usize;
    /// This rank's host, for messages.
    fn host(&self) -> String;
    /// Adds `values` up over the ranks, element by element: every rank gets the sums.
    fn sum_f32(&self, values: &mut [f32]);
    /// As [`sum_f32`](Self::sum_f32), in f64.
    fn sum_f64(&self, values: &mut [f64]);
    /// Rank 0's `bytes` on every rank (the others' replaced).
    fn broadcast(&self, bytes: &mut Vec<u8>);
    /// The gradients' all-reduce, callable from a thread of the engine's own while its other
    /// threads compute (the fused engine's overlap); `None` if the ranks cannot.
    fn overlapped_sum(&self) -> Option<&dyn GradientSum>;
    /// Ends every rank of the job now with `code`: what a failing rank does, so that no rank is
    /// left waiting in a collective for one that is gone.
    fn abort(&self, code: i32) -> !;
}

/// The ranks of a run, shared by what talks to them (the trainer, its engine).
#[derive(Clone)]
pub struct Ranks(pub Rc<dyn Collective>);

impl fmt::Debug for Ranks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} of {}", self.0.rank(), self.0.size())
    }
}

impl std::ops::Deref for Ranks {
    type Target = dyn Collective;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl Ranks {
    /// Whether this rank writes the run (rank 0).
    pub fn leads(&self) -> bool {
        self.rank() == 0
    }

    /// Rank 0's `text` on every rank.
    pub fn broadcast_text(&self, text: &str) -> Result<String> {
        let mut bytes = text.as_bytes().to_vec();
        self.broadcast(&mut bytes);
        Ok(String::from_utf8(bytes)?)
    }

    /// An error if this rank's `value` (a checksum of what every rank must hold alike) is not
    /// rank 0's, naming this rank, its host and `what`.
    pub fn check_same(&self, value: [u8; 32], what: &str) -> Result<()> {
        let mut theirs = value.to_vec();
        self.broadcast(&mut theirs);
        if theirs[..] != value[..] {
            anyhow::bail!(
                "rank {} (host {}) holds other {what} than rank 0",
                self.rank(),
                self.host()
            );
        }
        Ok(())
    }
}
