//! Default process identities. Peers route by these names (a worker's batches, an api-server's
//! outputs), so two processes must never share one: the default joins the role, this host's
//! name and the endpoint or port the process serves on, which is unique per host and stays the
//! same across restarts of one process (a resync after a restart needs that).

/// `role@host/place`, e.g. `worker@node-3/ipc:///run/specula/worker-0.sock`.
pub fn default_id(role: &str, place: &str) -> String {
    format!("{role}@{}/{place}", host_name())
}

/// This process start's epoch: what tells its peers that a process with a known id restarted
/// (its old state is gone). Random, not the clock: two starts within a clock tick, or after the
/// clock was set back, would repeat a clock's value. 63 bits, so it stays exact wherever it is
/// read as a signed integer.
pub fn new_epoch() -> u64 {
    rand::random::<u64>() >> 1
}

/// This machine's host name (`localhost` when the kernel does not say).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_role_host_and_place() {
        let id = default_id("worker", "tcp://127.0.0.1:5555");
        assert!(id.starts_with("worker@"), "{id}");
        assert!(id.ends_with("/tcp://127.0.0.1:5555"), "{id}");
        assert!(id.contains(&host_name()));
        assert_ne!(id, default_id("worker", "tcp://127.0.0.1:5556"));
    }

    #[test]
    fn epochs_differ_between_starts_and_fit_63_bits() {
        let epochs: std::collections::HashSet<u64> = (0..1000).map(|_| new_epoch()).collect();
        assert_eq!(epochs.len(), 1000);
        assert!(epochs.iter().all(|e| *e < 1 << 63));
    }
}
