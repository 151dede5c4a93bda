//! The host's memory: what the CPU backends allocate from, and what the memory check compares
//! a run's estimate with on the CPU.

/// Memory available to this process: what the kernel could hand out now, within the cgroup's
/// limit when there is one. `None` where neither can be read (not Linux).
pub fn available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let system = meminfo
        .as_deref()
        .and_then(|m| meminfo_kib(m, "MemAvailable:"));
    let read = |name: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/{name}")).ok();
    let cgroup = match (read("memory.max"), read("memory.current")) {
        (Some(max), Some(current)) => max
            .trim()
            .parse::<u64>()
            .ok()
            .zip(current.trim().parse::<u64>().ok())
            .map(|(max, current)| max.saturating_sub(current)),
        _ => None,
    };
    match (system.map(|kib| kib * 1024), cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn meminfo_kib(meminfo: &str, key: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with(key))?;
    line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_read_in_kib() {
        let meminfo = "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo_kib(meminfo, "MemAvailable:"), Some(20_000_000));
        assert_eq!(meminfo_kib(meminfo, "SwapFree:"), None);
    }
}
