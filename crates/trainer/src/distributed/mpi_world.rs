//! The ranks through MPI (rsmpi): all-reduce for the gradients and the loss, broadcast for what
//! rank 0 hands the others, abort for a rank that fails; and the gradients' all-reduce from the
//! engine's own thread while its backward goes on ([`Overlapped`]).

use std::time::Duration;

use anyhow::{Result, bail};
use mpi::collective::SystemOperation;
use mpi::environment::{Threading, Universe};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};
use tinygpt_model::GradientSum;

use super::collective::Collective;
use super::launcher::Launch;

/// MPI, started once for the process and finalised when this is dropped.
pub(super) struct MpiWorld {
    // Dropped after `world`: MPI is finalised last.
    world: SimpleCommunicator,
    /// The all-reduce the fused engine calls from a thread of its own; `None` where this MPI
    /// does not allow calls from several threads (the gradients are then added after the step).
    overlapped: Option<Overlapped>,
    local_size: usize,
    local_rank: usize,
    _universe: Universe,
}

impl MpiWorld {
    /// Starts MPI; the launcher's word on the world's size must agree with MPI's.
    pub(super) fn start(launch: &Launch) -> Result<Self> {
        let Some((universe, threading)) = mpi::initialize_with_threading(Threading::Multiple)
        else {
            bail!("MPI was started twice in one process");
        };
        let world = universe.world();
        let size = world.size() as usize;
        if size != launch.size {
            bail!(
                "{} says {} ranks but MPI counts {size}: this tinygpt was linked against \
                 another MPI than the launcher's (use the mpirun of the MPI it was built with)",
                launch.launcher,
                launch.size
            );
        }
        let overlapped = (threading == Threading::Multiple).then(|| Overlapped {
            comm: world.duplicate(),
        });
        Ok(Self {
            world,
            overlapped,
            local_size: launch.local_size.unwrap_or(1),
            local_rank: launch.local_rank.unwrap_or(0),
            _universe: universe,
        })
    }
}

impl Collective for MpiWorld {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn local_size(&self) -> usize {
        self.local_size
    }

    fn local_rank(&self) -> usize {
        self.local_rank
    }

    fn host(&self) -> String {
        mpi::environment::processor_name().unwrap_or_else(|_| "unknown".into())
    }

    fn sum_f32(&self, values: &mut [f32]) {
        // rsmpi has no in-place all-reduce: a copy is sent.
        let send = values.to_vec();
        self.world
            .all_reduce_into(&send[..], values, SystemOperation::sum());
    }

    fn sum_f64(&self, values: &mut [f64]) {
        let send = values.to_vec();
        self.world
            .all_reduce_into(&send[..], values, SystemOperation::sum());
    }

    fn broadcast(&self, bytes: &mut Vec<u8>) {
        let root = self.world.process_at_rank(0);
        let mut len = bytes.len() as u64;
        root.broadcast_into(&mut len);
        bytes.resize(len as usize, 0);
        root.broadcast_into(&mut bytes[..]);
    }

    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }

    fn overlapped_sum(&self) -> Option<&dyn GradientSum> {
        self.overlapped.as_ref().map(|o| o as &dyn GradientSum)
    }
}

/// The gradients' all-reduce on a communicator of its own, called by the fused engine from the
/// thread that sums each block as its backward ends. It waits by testing the request between
/// short sleeps, as Horovod's background thread does: MPI's blocking wait spins on a core the
/// backward is using.
pub(super) struct Overlapped {
    comm: SimpleCommunicator,
}

/// How long the reducing thread sleeps between tests of its all-reduce: short beside a layer's
/// transfer (a megabyte takes 0.8 ms at 10 Gbit/s), long enough to leave the cores to the
/// backward.
const POLL: Duration = Duration::from_micros(50);

// SAFETY: MPI was started with `MPI_THREAD_MULTIPLE` (an `Overlapped` exists only then), under
// which any thread may call MPI. The communicator is a handle that MPI itself synchronises; the
// engine calls `sum` from one thread at a time, and every rank makes the same calls in the same
// order on this communicator, which nothing else uses.
unsafe impl Send for Overlapped {}
unsafe impl Sync for Overlapped {}

impl GradientSum for Overlapped {
    fn sum(&self, values: &mut [f32]) {
        let send = values.to_vec();
        mpi::request::scope(|scope| {
            let mut request = self.comm.immediate_all_reduce_into(
                scope,
                &send[..],
                values,
                SystemOperation::sum(),
            );
            loop {
                match request.test() {
                    Ok(_) => break,
                    Err(pending) => {
                        request = pending;
                        std::thread::sleep(POLL);
                    }
                }
            }
        });
    }
}
