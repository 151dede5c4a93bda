//! Which launcher started this process, and as which of how many ranks: read from the
//! variables each launcher sets, before MPI starts (so that a binary built without MPI can tell
//! it was started as one of several, and refuse).

use anyhow::{Context, Result, bail};

/// A launcher's word on this process: one of `size` ranks, `local_size` of them on this host,
/// the `local_rank`-th there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The launcher, as a user would name it.
    pub launcher: &'static str,
    pub size: usize,
    pub rank: usize,
    /// Ranks on this host, where the launcher says.
    pub local_size: Option<usize>,
    /// This rank's place among them (which GPU it takes), where the launcher says.
    pub local_rank: Option<usize>,
}

/// Each launcher's variables: world size, rank, ranks on this host, rank on this host.
const LAUNCHERS: [(&str, [&str; 4]); 3] = [
    (
        "Open MPI's mpirun",
        [
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
        ],
    ),
    // MPICH's and Intel MPI's Hydra (`mpiexec`).
    (
        "mpiexec (Hydra)",
        ["PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS", "MPI_LOCALRANKID"],
    ),
    // A job step's tasks; SLURM_NTASKS alone is also set in a batch script, which is one
    // process.
    (
        "Slurm's srun",
        [
            "SLURM_STEP_NUM_TASKS",
            "SLURM_PROCID",
            "SLURM_STEP_TASKS_PER_NODE",
            "SLURM_LOCALID",
        ],
    ),
];

impl Launch {
    /// What this process's environment says, `None` when no launcher started it.
    pub fn detect() -> Result<Option<Launch>> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`detect`](Self::detect) over the variables `var` gives.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>> {
        for (launcher, [size, rank, local, local_rank]) in LAUNCHERS {
            let Some(size_text) = var(size) else {
                continue;
            };
            let number = |name: &str, text: &str| -> Result<usize> {
                leading_number(text).with_context(|| {
                    format!("{launcher} set {name}={text:?}, which is not a number")
                })
            };
            let size_n = number(size, &size_text)?;
            let rank_text = var(rank).unwrap_or_default();
            let rank_n = number(rank, &rank_text)?;
            if size_n == 0 || rank_n >= size_n {
                bail!("{launcher} says rank {rank_n} of {size_n}, which cannot be");
            }
            let local_size = var(local).and_then(|t| leading_number(&t).ok());
            return Ok(Some(Launch {
                launcher,
                size: size_n,
                rank: rank_n,
                local_size: local_size.filter(|&n| n > 0),
                local_rank: var(local_rank).and_then(|t| leading_number(&t).ok()),
            }));
        }
        Ok(None)
    }

    /// Threads for each rank on this host when the config leaves it to tinygpt
    /// ([`threads_per_rank`]).
    pub fn threads_per_rank(&self, cores: usize) -> usize {
        threads_per_rank(cores, self.local_size.unwrap_or(1))
    }
}

/// A host's `cores` shared by the `local_size` ranks on it (at least one thread each), so that
/// 2 ranks on 2 cores never run 4 threads.
pub fn threads_per_rank(cores: usize, local_size: usize) -> usize {
    (cores / local_size.max(1)).max(1)
}

/// The number `text` starts with (Slurm writes tasks per node as `2(x3),1`: the first node's).
fn leading_number(text: &str) -> Result<usize> {
    let digits: String = text
        .trim()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Ok(digits.parse()?)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::Launch;

    fn launch(vars: &[(&str, &str)]) -> anyhow::Result<Option<Launch>> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Launch::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn each_launcher_is_read_from_its_own_variables() {
        assert_eq!(launch(&[]).unwrap(), None);
        let ompi = launch(&[
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((ompi.size, ompi.rank, ompi.local_size), (4, 3, Some(2)));
        assert_eq!(ompi.local_rank, Some(1));
        assert_eq!(ompi.threads_per_rank(16), 8);
        let hydra = launch(&[("PMI_SIZE", "2"), ("PMI_RANK", "0")])
            .unwrap()
            .unwrap();
        assert_eq!(
            (hydra.launcher, hydra.local_size),
            ("mpiexec (Hydra)", None)
        );
        let srun = launch(&[
            ("SLURM_NTASKS", "8"),
            ("SLURM_STEP_NUM_TASKS", "8"),
            ("SLURM_PROCID", "5"),
            ("SLURM_STEP_TASKS_PER_NODE", "4(x2)"),
            ("SLURM_LOCALID", "1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (srun.rank, srun.local_size, srun.local_rank),
            (5, Some(4), Some(1))
        );
        // A batch script: the job's tasks, but this is one process.
        assert_eq!(launch(&[("SLURM_NTASKS", "8")]).unwrap(), None);
    }

    #[test]
    fn impossible_words_are_refused_by_name() {
        let err = launch(&[("PMI_SIZE", "two"), ("PMI_RANK", "0")]).unwrap_err();
        assert!(format!("{err:#}").contains("PMI_SIZE=\"two\""), "{err:#}");
        let err =
            launch(&[("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_RANK", "2")]).unwrap_err();
        assert!(err.to_string().contains("rank 2 of 2"), "{err}");
        assert_eq!(
            launch(&[("OMPI_COMM_WORLD_SIZE", "3"), ("OMPI_COMM_WORLD_RANK", "1")])
                .unwrap()
                .unwrap()
                .threads_per_rank(2),
            2,
            "without a local size, the cores are this rank's"
        );
    }
}
