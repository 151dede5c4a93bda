//! The ranks through MPI (rsmpi): all-reduce for the gradients and the loss, broadcast for what
//! rank 0 hands the others, abort for a rank that fails.

use anyhow::{Result, bail};
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};

use super::collective::Collective;
use super::launcher::Launch;

/// MPI, started once for the process and finalised when this is dropped.
pub(super) struct MpiWorld {
    // Dropped after `world`: MPI is finalised last.
    world: SimpleCommunicator,
    local_size: usize,
    local_rank: usize,
    _universe: Universe,
}

impl MpiWorld {
    /// Starts MPI; the launcher's word on the world's size must agree with MPI's.
    pub(super) fn start(launch: &Launch) -> Result<Self> {
        let Some(universe) = mpi::initialize() else {
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
        Ok(Self {
            world,
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
}
