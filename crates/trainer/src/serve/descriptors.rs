//! File descriptors: each connection holds one, and a process that runs out cannot even
//! accept to refuse. The soft limit is raised to the hard one where allowed, and the
//! connection limit kept within what is left.

/// Descriptors kept back beyond those open at start, for what the server opens later
/// (a checkpoint, the runtime's own).
const SPARE: u64 = 32;

/// `wanted` connections, or fewer where the descriptor limit cannot hold them (with a note).
pub(crate) fn connection_budget(wanted: usize) -> usize {
    let Some(limit) = raise_soft_limit() else {
        return wanted;
    };
    let free = limit.saturating_sub(open_now() + SPARE).max(1) as usize;
    if wanted > free {
        eprintln!(
            "note: --max-connections {wanted} lowered to {free}: this process may open {limit} \
             files (ulimit -n)"
        );
        return free;
    }
    wanted
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one (bounded: some systems say "unlimited");
/// returns the soft limit in force, `None` where it cannot be read.
#[cfg(unix)]
fn raise_soft_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write only the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        let target = limit.rlim_max.min(1 << 20);
        if target > limit.rlim_cur {
            let raised = libc::rlimit {
                rlim_cur: target,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = target;
            }
        }
    }
    Some(limit.rlim_cur)
}

#[cfg(not(unix))]
fn raise_soft_limit() -> Option<u64> {
    None
}

/// Descriptors open now (Linux's `/proc/self/fd`; a guess elsewhere).
fn open_now() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(64, |dir| dir.count() as u64)
}
