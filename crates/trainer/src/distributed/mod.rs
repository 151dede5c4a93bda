//! Training beyond one process: `mpirun -np N tinygpt train …` trains one run over N ranks,
//! data-parallel. The step's micro-batches are dealt to the ranks (rank `r` takes micro-batch
//! `k` where `k mod N = r`), each drawing its windows and dropout masks from the step's seed and
//! its *global* index, so the work is the one process's, split; the gradients and the loss are
//! then added up over the ranks (MPI's all-reduce) and every rank clips and updates alike.
//! Rank 0 alone resolves the run (config, tokenizer, weights, optimizer state), hands it to the
//! others, and writes everything; the others print nothing unless they fail.
//!
//! ```text
//! collective.rs what the ranks do together (the Collective trait) and the Ranks handle
//! cost.rs       what adding up a run's gradients costs (`bench --all-reduce`)
//! launcher.rs   which launcher started this process, as which rank (read before MPI starts)
//! mpi_world.rs  the ranks through MPI (the `mpi` feature: rsmpi over Open MPI or MPICH)
//! ```
//!
//! Nothing here is a transport of tinygpt's own: without the `mpi` feature a process started
//! as one of several ranks refuses, rather than run as N separate runs writing one directory.

mod collective;
pub mod cost;
mod launcher;
#[cfg(feature = "mpi")]
mod mpi_world;

#[cfg(feature = "mpi")]
use std::rc::Rc;

use anyhow::Result;

pub use collective::{Collective, Ranks};
pub use launcher::{Launch, threads_per_rank};

/// Sets what MPI reads when it starts, unless the user set it: Open MPI's non-blocking
/// all-reduce (the fused engine's sums during the backward) picks reduce-then-broadcast below
/// four ranks, so each gradient crosses the link twice, one way at a time; its ring sends both
/// ways at once (4.7 s instead of 8.9 s for the 135M shape's gradients between two ranks at
/// 1 Gbit/s). Other MPIs ignore the name; without the `mpi` feature this does nothing.
///
/// # Safety
/// Changes the environment: call it before any other thread exists (first thing in `main`).
pub unsafe fn prepare_environment() {
    #[cfg(feature = "mpi")]
    if std::env::var_os("OMPI_MCA_coll_libnbc_iallreduce_algorithm").is_none() {
        // SAFETY: the caller guarantees no other thread reads the environment.
        unsafe { std::env::set_var("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1") };
    }
}

/// The ranks this process trains with: `None` when it runs alone (no launcher, or a launcher
/// of one rank). Started by a launcher as one of several, it starts MPI (the `mpi` feature),
/// or refuses in one line without it.
pub fn start() -> Result<Option<Ranks>> {
    let Some(launch) = Launch::detect()? else {
        return Ok(None);
    };
    if launch.size == 1 {
        return Ok(None);
    }
    join(launch)
}

#[cfg(feature = "mpi")]
fn join(launch: Launch) -> Result<Option<Ranks>> {
    Ok(Some(Ranks(Rc::new(mpi_world::MpiWorld::start(&launch)?))))
}

#[cfg(not(feature = "mpi"))]
fn join(launch: Launch) -> Result<Option<Ranks>> {
    anyhow::bail!(
        "{} started this process as rank {} of {}, but this tinygpt was built without MPI: \
         build it with `cargo build --release --features mpi` to train over ranks (each rank \
         would otherwise train a run of its own into the same directory), or start one process",
        launch.launcher,
        launch.rank,
        launch.size
    )
}
