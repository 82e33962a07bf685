//! Process-wide memory settings shared by the token-processor and its benchmark.

/// Turns transparent huge pages off for this process (Linux; elsewhere a no-op).
///
/// mimalloc 3 asks for huge pages on its arenas (`MADV_HUGEPAGE`) and purges free ranges a
/// second after they empty; reusing a purged range then faults in a whole 2 MiB page, which the
/// kernel zeroes first. Flooded with 512-row batches that zeroing was 27% of the
/// token-processor's CPU, and at engine-like rates it stalled single batches for 4–16 ms
/// (docs/history/benchmarks-notebook.md). The tracker's working set is O(K) per request, so small pages cost
/// nothing measurable.
pub fn disable_transparent_huge_pages() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_THP_DISABLE only sets a flag on the calling process; no memory is
        // passed to the kernel.
        let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn the_kernel_reports_huge_pages_off_for_the_process() {
        super::disable_transparent_huge_pages().unwrap();
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("THP_enabled:"))
            .expect("kernel reports THP_enabled (Linux >= 5.0)");
        assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
    }
}
