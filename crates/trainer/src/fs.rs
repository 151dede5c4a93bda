//! Writing files and directories so that a crash at any instant leaves the old or the new
//! version, never a mix: the primitives run directories, prepared corpora and exports are
//! written with.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes `bytes` to the new file `path` and flushes it to disk.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file =
        File::create(path).with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// `dir` must not exist, or be an empty directory: whatever else is there is never overwritten.
pub(crate) fn refuse_non_empty(dir: &Path) -> Result<()> {
    if dir
        .read_dir()
        .is_ok_and(|mut entries| entries.next().is_some())
    {
        bail!(
            "{} exists and is not empty: choose another --out (nothing was written)",
            dir.display()
        );
    }
    if dir.exists() && !dir.is_dir() {
        bail!("{} exists and is not a directory", dir.display());
    }
    Ok(())
}

/// A temporary directory beside `path` (same filesystem, so it can be renamed to it), named
/// `.NAME.PURPOSE-PID-XXXXXX` and removed when dropped. Those of the same name and purpose
/// that a process no longer running left (killed with -9, or a second Ctrl-C) are removed
/// first.
pub(crate) fn temp_beside(path: &Path, purpose: &str) -> Result<tempfile::TempDir> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    let parent = parent.unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    let prefix = format!(".{name}.{purpose}-");
    remove_stale(parent, &prefix);
    tempfile::Builder::new()
        .prefix(&format!("{prefix}{}-", std::process::id()))
        .tempdir_in(parent)
        .with_context(|| format!("cannot create a directory in {}", parent.display()))
}

/// Removes the directories in `parent` named `PREFIX``PID`-… whose process has ended.
fn remove_stale(parent: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !process_exists(pid) && entry.path().is_dir() {
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => eprintln!(
                    "note: removed {}, left by an earlier tinygpt (process {pid}) that did not \
                     finish",
                    entry.path().display()
                ),
                Err(e) => eprintln!("note: cannot remove {}: {e}", entry.path().display()),
            }
        }
    }
}

/// Whether a process `pid` runs (one that cannot be asked counts as running).
#[cfg(unix)]
fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
    let asked = unsafe { libc::kill(pid, 0) };
    asked == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(not(unix))]
fn process_exists(_: u32) -> bool {
    true
}

/// Staging directories to remove if the process is stopped by a signal before it is done
/// (see [`on_signal_remove`]).
static STAGING: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Set once a signal has started removing the staging directories.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set inside the signal handler itself, before the Ctrl-C handler's thread gets to run.
static SIGNALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a signal has come and the handler will remove the staging directories and exit 130:
/// the work that fails meanwhile (its directory gone, or its input closed by whoever sent the
/// signal) is no error to report.
pub fn interrupted() -> bool {
    SIGNALLED.load(std::sync::atomic::Ordering::SeqCst)
        || INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Sets [`SIGNALLED`] in the signal handler proper. The Ctrl-C handler runs later on a thread
/// of its own; meanwhile the main thread may already see the failure the signal's sender
/// caused (a closed input) and must know not to report it.
#[cfg(unix)]
fn flag_signals() -> Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the action only stores to an atomic, which is async-signal-safe; the handler
        // installed before (ctrlc's) is chained and still runs.
        unsafe {
            signal_hook_registry::register(signal, || {
                SIGNALLED.store(true, std::sync::atomic::Ordering::SeqCst)
            })
        }
        .context("cannot install the signal handler")?;
    }
    Ok(())
}

#[cfg(not(unix))]
fn flag_signals() -> Result<()> {
    Ok(())
}

/// On Ctrl-C, SIGTERM or SIGHUP, removes `dir` and exits 130: for commands that only write a
/// staging directory until their last rename. Call once per process.
pub(crate) fn on_signal_remove(dir: &Path) -> Result<()> {
    STAGING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(dir.to_path_buf());
    ctrlc::set_handler(|| {
        INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
        let staging = STAGING.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for dir in staging {
            // The work goes on meanwhile and may add a file: try again.
            for _ in 0..10 {
                if std::fs::remove_dir_all(&dir).is_ok() || !dir.exists() {
                    break;
                }
            }
        }
        eprintln!("\ntinygpt: interrupted; nothing was written");
        std::process::exit(130);
    })
    .context("cannot install the Ctrl-C handler")?;
    flag_signals()
}

/// Puts the directory `new` in place of `dst` with two renames: an existing `dst` first
/// becomes `old` (replacing an earlier `old`), so a crash between them leaves one of the two.
/// The caller decides whether `old` stays.
pub(crate) fn swap_dir(new: &Path, dst: &Path, old: &Path) -> Result<()> {
    if dst.exists() {
        if old.exists() {
            std::fs::remove_dir_all(old)?;
        }
        std::fs::rename(dst, old)?;
    }
    std::fs::rename(new, dst).with_context(|| format!("cannot create {}", dst.display()))
}

/// A new directory `dst` holding `src`'s files, each hard-linked (the same bytes on the disk,
/// never written twice), or copied where the filesystem has no links. Only for files nothing
/// writes in place: a run's checkpoint files, which every save replaces by a new directory.
pub(crate) fn link_dir(src: &Path, dst: &Path) -> Result<()> {
    std::fs::create_dir_all(dst).with_context(|| format!("cannot create {}", dst.display()))?;
    for entry in std::fs::read_dir(src).with_context(|| format!("cannot read {}", src.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            let (from, to) = (entry.path(), dst.join(entry.file_name()));
            if std::fs::hard_link(&from, &to).is_err() {
                std::fs::copy(&from, &to).with_context(|| {
                    format!("cannot copy {} to {}", from.display(), to.display())
                })?;
            }
        }
    }
    Ok(())
}
