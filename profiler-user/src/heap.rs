//! Keeps a long session's resident memory from creeping up while its live
//! data stays flat (issue 11's soak: under 1 MB an hour).
//!
//! The agent's live heap is bounded (the soak's heaptrack diffs between
//! minute 3 and minute 9 differ by under 100 kB), but glibc's allocator
//! let the RSS grow by steps: the ring consumer and the `profile.data`
//! encoder allocate and free buffers of hundreds of kilobytes to a few
//! megabytes, and glibc raises its mmap threshold each time such a block
//! is freed (up to 32 MiB), so later ones come from the heap, where freed
//! space is kept and fragments. Two settings stop that: a fixed mmap
//! threshold (big blocks always go back to the kernel when freed, and the
//! threshold no longer moves) and a periodic `malloc_trim`, which returns
//! the free pages inside the arenas.

/// Blocks at least this large are mmap'd and unmapped on free. (musl's
/// allocator, in the static build, has a fixed threshold of its own.)
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 256 * 1024;

/// Fixes the allocator's mmap threshold; call once, before the session's
/// threads start (the setting applies to every arena).
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Returns the arenas' free pages to the kernel (every few seconds in a
/// long session; it takes well under a millisecond on the agent's heap).
pub fn release_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rss_kb() -> u64 {
        let s = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4
    }

    /// Measured in a process of its own (this test binary again, running
    /// only this test): the other tests' allocations would move the RSS.
    #[test]
    fn freed_big_buffers_leave_no_resident_memory_behind() {
        const ALONE: &str = "PROFILER_HEAP_TEST_ALONE";
        if std::env::var_os(ALONE).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "heap::tests::freed_big_buffers_leave_no_resident_memory_behind",
                    "--test-threads=1",
                    "--nocapture",
                ])
                .env(ALONE, "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{text}");
            assert!(text.contains("1 passed"), "{text}");
            return;
        }
        // A big buffer freed raises glibc's dynamic mmap threshold, so the
        // next ones would come from the heap...
        drop(std::hint::black_box(vec![1u8; 4 << 20]));
        tune();
        let before = rss_kb();
        // ...between small blocks that stay (the encoder's buffers and the
        // events' small allocations, interleaved).
        let mut small = Vec::new();
        let mut big = Vec::new();
        for i in 1..=16u8 {
            big.push(std::hint::black_box(vec![i; 1 << 20]));
            small.push(std::hint::black_box(vec![i; 64]));
        }
        let during = rss_kb();
        drop(big);
        release_free();
        let after = rss_kb();
        assert!(during >= before + 15 * 1024, "{before} -> {during} kB");
        assert!(
            after < before + 2 * 1024,
            "{before} -> {during} -> {after} kB"
        );
        drop(small);
    }
}
