//! Memory bandwidth of this machine, as the ceiling for token generation: decoding one token
//! streams every weight once, so `weight bytes x tok/s` can be set against what a plain copy
//! or read loop reaches. Best of N rounds (the least disturbed one on a shared machine).

use std::hint::black_box;
use std::time::Instant;

#[derive(Clone, Debug, serde::Serialize)]
pub struct MemBw {
    /// Bytes per buffer.
    pub bytes: usize,
    pub threads: usize,
    pub rounds: usize,
    /// memcpy of one buffer into another: bytes copied per second (the memory traffic is
    /// about twice that: one read and one write of each byte).
    pub copy_gbps: f64,
    /// Sum of every u64 of one buffer: bytes read per second (what decode does with weights).
    pub read_gbps: f64,
}

/// Splits `len` into `parts` contiguous ranges, the first ones one longer.
fn ranges(len: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let parts = parts.max(1);
    let (q, r) = (len / parts, len % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let n = q + usize::from(i < r);
            let range = start..start + n;
            start += n;
            range
        })
        .collect()
}

fn copy_once(src: &[u64], dst: &mut [u64], threads: usize) -> f64 {
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let mut rest = &mut *dst;
        let mut done = 0;
        for r in ranges(src.len(), threads) {
            let (mine, tail) = rest.split_at_mut(r.end - done);
            done = r.end;
            rest = tail;
            let from = &src[r];
            s.spawn(move || mine.copy_from_slice(from));
        }
    });
    black_box(&dst);
    t0.elapsed().as_secs_f64()
}

fn read_once(src: &[u64], threads: usize) -> f64 {
    let t0 = Instant::now();
    let total = std::thread::scope(|s| {
        let handles: Vec<_> = ranges(src.len(), threads)
            .into_iter()
            .map(|r| {
                let part = &src[r];
                // Four independent sums so the adds pipeline and vectorize.
                s.spawn(move || {
                    let mut acc = [0u64; 4];
                    for c in part.chunks_exact(4) {
                        for (a, x) in acc.iter_mut().zip(c) {
                            *a = a.wrapping_add(*x);
                        }
                    }
                    acc.iter().fold(0u64, |a, x| a.wrapping_add(*x))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(0))
            .fold(0u64, u64::wrapping_add)
    });
    black_box(total);
    t0.elapsed().as_secs_f64()
}

/// Measures copy and read bandwidth over buffers of `bytes` (rounded down to 32 bytes) with
/// `threads` threads, best of `rounds`. The buffers are written once first so every page is
/// mapped before timing.
pub fn measure(bytes: usize, threads: usize, rounds: usize) -> MemBw {
    let words = (bytes / 32) * 4;
    let src: Vec<u64> = (0..words as u64).collect();
    let mut dst = vec![1u64; words];
    let n_bytes = words * 8;
    let rounds = rounds.max(1);
    let mut best_copy = f64::INFINITY;
    let mut best_read = f64::INFINITY;
    for _ in 0..rounds {
        best_copy = best_copy.min(copy_once(&src, &mut dst, threads));
        best_read = best_read.min(read_once(&src, threads));
    }
    MemBw {
        bytes: n_bytes,
        threads,
        rounds,
        copy_gbps: n_bytes as f64 / best_copy / 1e9,
        read_gbps: n_bytes as f64 / best_read / 1e9,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_everything_once() {
        for (len, parts) in [(10, 3), (3, 8), (0, 2), (64, 1)] {
            let rs = ranges(len, parts);
            assert_eq!(rs.len(), parts);
            let mut next = 0;
            for r in rs {
                assert_eq!(r.start, next);
                next = r.end;
            }
            assert_eq!(next, len);
        }
    }

    #[test]
    fn copy_copies_every_word() {
        // Control: with `ranges` dropping the remainder (q only), the last words stay 0.
        let src: Vec<u64> = (1..=1003).collect();
        let mut dst = vec![0u64; src.len()];
        copy_once(&src, &mut dst, 3);
        assert_eq!(src, dst);
    }
}
