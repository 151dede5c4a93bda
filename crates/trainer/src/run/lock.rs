//! One writer per run: an exclusive advisory lock on `RUN/lock`, held for as long as a command
//! writes the run. The operating system drops it when the process ends, however it ends, so a
//! killed trainer leaves no stale lock behind. Readers (`generate`, `eval`, `info`, ...) take
//! none: every file they read is replaced by a rename, never written in place.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// The lock file's name in a run directory. It holds the writer's process id.
pub(crate) const LOCK: &str = "lock";

/// The held lock; dropping it releases the run.
#[derive(Debug)]
pub(crate) struct RunLock {
    _file: File,
}

impl RunLock {
    /// Takes the lock of the run in `dir`, or fails at once naming the process that holds it.
    pub(crate) fn acquire(dir: &Path) -> Result<Self> {
        let path = dir.join(LOCK);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot open the lock file {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|pid| pid.trim().parse::<u32>().ok())
                    .map_or("another process".to_string(), |pid| {
                        format!("process {pid}")
                    });
                bail!(
                    "run {} is in use by {holder} (one writer at a time; wait for it to finish or \
                     stop it)",
                    dir.display()
                );
            }
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("cannot lock {}", path.display()));
            }
        }
        // Only the holder writes: a second writer reads whom to name.
        file.set_len(0)
            .and_then(|()| write!(file, "{}", std::process::id()))
            .and_then(|()| file.flush())
            .with_context(|| format!("cannot write the lock file {}", path.display()))?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_writer_is_refused_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = RunLock::acquire(dir.path()).unwrap();
        let err = RunLock::acquire(dir.path()).unwrap_err().to_string();
        let pid = std::process::id();
        assert!(
            err.contains(&format!("is in use by process {pid}")),
            "{err}"
        );
        drop(first);
        RunLock::acquire(dir.path()).expect("released on drop");
    }
}
