//! Splitting work across threads: `std::thread::scope` per op (a persistent pool is the
//! next issue's speed work).

use std::ops::Range;

/// Runs `f` over `threads` contiguous chunks of `0..n` and returns the results in order.
/// Runs inline for one thread or tiny `n`.
pub fn par_ranges<T: Send>(
    n: usize,
    threads: usize,
    f: impl Fn(Range<usize>) -> T + Sync,
) -> Vec<T> {
    let threads = threads.clamp(1, n.max(1));
    if threads == 1 {
        return vec![f(0..n)];
    }
    let chunk = n.div_ceil(threads);
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let r = (i * chunk).min(n)..((i + 1) * chunk).min(n);
                s.spawn(move || f(r))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// The number of physical cores (logical CPUs / 2 when SMT siblings are listed, at least 1).
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let smt = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
        .map(|s| s.split([',', '-']).count() > 1)
        .unwrap_or(false);
    if smt {
        (logical / 2).max(1)
    } else {
        logical
    }
}
