//! Collective communication between the ranks of a tensor-parallel group (issue 36, ADR 0015).
//!
//! A rank holds one shard of every weight (`minfer_models::shard`); after each row-parallel
//! projection the ranks' partial sums are added with [`Communicator::all_reduce_sum`], and the
//! vocabulary-split output head's pieces are joined with [`Communicator::all_gather`].
//!
//! Every wait is bounded: a rank that fails calls [`Communicator::abort`] (or drops its
//! handle), and every other rank's pending or next collective returns
//! [`CommError::Aborted`] naming it; a rank that stops answering turns into
//! [`CommError::Timeout`] on the ranks waiting for it. No rank hangs on another.
//!
//! [`LoopbackGroup`] is the in-process implementation (ranks as threads, one barrier with a
//! timeout). The NCCL one lives in `minfer_cuda::nccl`, behind the `cuda` feature.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why a collective did not complete. Every rank of a broken group gets one of these.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CommError {
    /// A rank gave up (its own error, or its handle dropped while others still wait).
    #[error("tensor-parallel rank {rank} of {size} aborted the group: {reason}")]
    Aborted {
        rank: usize,
        size: usize,
        reason: String,
    },
    /// This rank waited longer than the group's bound for the others.
    #[error(
        "tensor-parallel rank {rank} of {size}: {op} timed out after {waited_ms} ms waiting for rank(s) {missing:?}"
    )]
    Timeout {
        rank: usize,
        size: usize,
        op: &'static str,
        waited_ms: u128,
        missing: Vec<usize>,
    },
    /// The ranks called different collectives or passed different lengths.
    #[error("tensor-parallel rank {rank}: {op} of {len} elements does not match rank {other}'s {other_op} of {other_len}")]
    Mismatch {
        rank: usize,
        op: &'static str,
        len: usize,
        other: usize,
        other_op: &'static str,
        other_len: usize,
    },
    /// A buffer of the wrong length (all_gather's receive buffer must be size x send).
    #[error("tensor-parallel rank {rank}: {what}")]
    BadBuffer { rank: usize, what: String },
    /// The transport itself failed (NCCL's error code, a missing library).
    #[error("tensor-parallel transport: {0}")]
    Transport(String),
}

pub type CommResult<T> = std::result::Result<T, CommError>;

/// One rank's end of a tensor-parallel group. Every rank calls the same collectives in the
/// same order with the same lengths; a rank that cannot must [`abort`](Self::abort).
pub trait Communicator: Send {
    /// This rank's index, 0 ≤ rank < size.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// Replaces `buf` on every rank by the element-wise sum of every rank's `buf`.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> CommResult<()>;
    /// Writes rank r's `send` to `recv[r * send.len()..(r + 1) * send.len()]` on every rank;
    /// `send` has the same length on every rank and `recv` is `size` times as long.
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> CommResult<()>;
    /// Breaks the group: every rank's pending and later collectives fail naming this rank.
    fn abort(&self, reason: &str);
}

/// What one rank deposited for the collective in flight.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    AllReduce,
    AllGather,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce_sum",
            Op::AllGather => "all_gather",
        }
    }
}

struct State {
    /// Each rank's contribution to the collective in flight (None: not arrived yet).
    slots: Vec<Option<(Op, Vec<f32>)>>,
    /// Ranks that have arrived at the current barrier phase.
    arrived: Vec<bool>,
    /// Barrier phases completed; a waiter is released when it moves past its own.
    generation: u64,
    /// Set once, by the first rank to abort; every later wait reports it.
    broken: Option<CommError>,
}

struct Shared {
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

/// The in-process group: `size` handles, one per rank thread.
///
/// The all-reduce sums in one fixed order, rank 0 + rank 1 + … + rank N−1, left to right in
/// f32, and every rank computes that same sum from the same deposits, so every rank gets the
/// same bits and a run is deterministic for a given N (it is not the N = 1 sum: the ranks'
/// partial sums are grouped differently, hence ADR 0015's tolerance class).
pub struct LoopbackGroup;

impl LoopbackGroup {
    /// `size` handles (rank 0 first) whose waits give up after `timeout`.
    pub fn ranks(size: usize, timeout: Duration) -> Vec<LoopbackComm> {
        assert!(size > 0, "a group has at least one rank");
        let shared = Arc::new(Shared {
            size,
            timeout,
            state: Mutex::new(State {
                slots: vec![None; size],
                arrived: vec![false; size],
                generation: 0,
                broken: None,
            }),
            cv: Condvar::new(),
        });
        (0..size)
            .map(|rank| LoopbackComm {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }
}

/// One rank's handle of a [`LoopbackGroup`]. Dropping it while other ranks still take part
/// aborts the group (a rank thread that returned early, or panicked, is never waited for).
pub struct LoopbackComm {
    rank: usize,
    shared: Arc<Shared>,
}

impl LoopbackComm {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a rank panicked holding it; the state is still consistent
        // (every update is a few assignments), and `broken` says what happened.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The barrier: marks this rank arrived and waits until every rank has, the group
    /// breaks, or the timeout passes. The last rank to arrive runs `last` under the lock
    /// before releasing the others.
    fn barrier<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        op: Op,
        last: impl FnOnce(&mut State),
    ) -> CommResult<MutexGuard<'a, State>> {
        if let Some(e) = &st.broken {
            return Err(e.clone());
        }
        let my_gen = st.generation;
        st.arrived[self.rank] = true;
        if st.arrived.iter().all(|a| *a) {
            last(&mut st);
            st.arrived.iter_mut().for_each(|a| *a = false);
            st.generation += 1;
            self.shared.cv.notify_all();
            return Ok(st);
        }
        let start = Instant::now();
        loop {
            // Released first: a rank that passed this barrier and then dropped its handle
            // must not fail the ones it released.
            if st.generation != my_gen {
                return Ok(st);
            }
            if let Some(e) = &st.broken {
                return Err(e.clone());
            }
            let waited = start.elapsed();
            if waited >= self.shared.timeout {
                let missing = (0..self.shared.size).filter(|&r| !st.arrived[r]).collect();
                let e = CommError::Timeout {
                    rank: self.rank,
                    size: self.shared.size,
                    op: op.name(),
                    waited_ms: waited.as_millis(),
                    missing,
                };
                // The group is unusable now: the late rank fails on arrival, not waits.
                st.broken.get_or_insert(CommError::Aborted {
                    rank: self.rank,
                    size: self.shared.size,
                    reason: e.to_string(),
                });
                self.shared.cv.notify_all();
                return Err(e);
            }
            let (g, _) = self
                .shared
                .cv
                .wait_timeout(st, self.shared.timeout - waited)
                .unwrap_or_else(|e| e.into_inner());
            st = g;
        }
    }

    /// Deposit, barrier, combine, barrier: the second barrier keeps a fast rank from
    /// overwriting its slot with the next collective before a slow one has read this one.
    fn collective(&self, op: Op, data: &[f32], combine: impl FnOnce(&State)) -> CommResult<()> {
        let mut st = self.lock();
        if let Some(e) = &st.broken {
            return Err(e.clone());
        }
        st.slots[self.rank] = Some((op, data.to_vec()));
        let st = self.barrier(st, op, |_| {})?;
        // Every rank checks agreement, so every rank reports a mismatch.
        for (other, s) in st.slots.iter().enumerate() {
            if let Some((o, v)) = s {
                if *o != op || v.len() != data.len() {
                    let e = CommError::Mismatch {
                        rank: self.rank,
                        op: op.name(),
                        len: data.len(),
                        other,
                        other_op: o.name(),
                        other_len: v.len(),
                    };
                    drop(st);
                    self.abort(&e.to_string());
                    return Err(e);
                }
            }
        }
        combine(&st);
        drop(self.barrier(st, op, |st| st.slots.iter_mut().for_each(|s| *s = None))?);
        Ok(())
    }
}

impl Communicator for LoopbackComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> CommResult<()> {
        let input = buf.to_vec();
        self.collective(Op::AllReduce, &input, |st| {
            // Fixed order: rank 0's values, then + rank 1's, …, + rank N−1's.
            for (i, out) in buf.iter_mut().enumerate() {
                let mut acc = 0f32;
                for (r, s) in st.slots.iter().enumerate() {
                    let v = s.as_ref().map(|(_, v)| v[i]).unwrap_or(0.0);
                    acc = if r == 0 { v } else { acc + v };
                }
                *out = acc;
            }
        })
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> CommResult<()> {
        if recv.len() != send.len() * self.shared.size {
            let e = CommError::BadBuffer {
                rank: self.rank,
                what: format!(
                    "all_gather receive buffer of {} elements, want {} x {}",
                    recv.len(),
                    self.shared.size,
                    send.len()
                ),
            };
            self.abort(&e.to_string());
            return Err(e);
        }
        self.collective(Op::AllGather, send, |st| {
            for (r, s) in st.slots.iter().enumerate() {
                if let Some((_, v)) = s {
                    recv[r * v.len()..(r + 1) * v.len()].copy_from_slice(v);
                }
            }
        })
    }

    fn abort(&self, reason: &str) {
        let mut st = self.lock();
        st.broken.get_or_insert(CommError::Aborted {
            rank: self.rank,
            size: self.shared.size,
            reason: reason.to_string(),
        });
        self.shared.cv.notify_all();
    }
}

impl Drop for LoopbackComm {
    fn drop(&mut self) {
        // A rank leaving while others might still call a collective: they must not wait
        // for it. After a clean end nobody calls again, so this breaks nothing.
        if std::thread::panicking() {
            self.abort("its thread panicked");
        } else {
            self.abort("its handle was dropped (the rank ended)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    fn run<T: Send + 'static>(
        n: usize,
        timeout: Duration,
        f: impl Fn(LoopbackComm) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let hs: Vec<_> = LoopbackGroup::ranks(n, timeout)
            .into_iter()
            .map(|c| {
                let f = f.clone();
                thread::spawn(move || f(c))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn all_reduce_sums_in_rank_order_with_the_same_bits_everywhere() {
        // 1e8 + 1 − 1e8 in f32: left to right gives 0 (1e8 + 1 rounds to 1e8); the
        // documented order is what every rank gets.
        let out = run(3, Duration::from_secs(5), |c| {
            let mut b = vec![[1e8f32, 1.0, -1e8][c.rank()], c.rank() as f32];
            c.all_reduce_sum(&mut b).unwrap();
            b
        });
        for b in &out {
            assert_eq!(b, &vec![0.0, 3.0]);
        }
        // Control: another order of the same values gives a different answer, so the test
        // above can see a change of order.
        assert_ne!(1e8f32 + -1e8 + 1.0, 1e8f32 + 1.0 + -1e8);
    }

    #[test]
    fn all_gather_concatenates_by_rank() {
        let out = run(4, Duration::from_secs(5), |c| {
            let send = vec![c.rank() as f32; 2];
            let mut recv = vec![-1.0; 8];
            c.all_gather(&send, &mut recv).unwrap();
            recv
        });
        for r in out {
            assert_eq!(r, vec![0., 0., 1., 1., 2., 2., 3., 3.]);
        }
    }

    #[test]
    fn many_collectives_in_a_row_stay_in_step() {
        let out = run(4, Duration::from_secs(5), |c| {
            let mut total = 0f32;
            for i in 0..200 {
                let mut b = [(c.rank() + i) as f32];
                c.all_reduce_sum(&mut b).unwrap();
                total += b[0];
            }
            total
        });
        // sum over i of (0+1+2+3 + 4i) = 200*6 + 4*19900
        for t in out {
            assert_eq!(t, (200 * 6 + 4 * 19900) as f32);
        }
    }

    #[test]
    fn an_aborting_rank_fails_every_rank_quickly() {
        let t0 = Instant::now();
        let out = run(4, Duration::from_secs(30), |c| {
            if c.rank() == 2 {
                c.abort("injected failure");
                return Err(CommError::Transport("rank 2 failed itself".into()));
            }
            let mut b = [1.0f32];
            c.all_reduce_sum(&mut b)
        });
        // Far below the 30 s bound: the abort wakes the waiters.
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        for (r, o) in out.iter().enumerate() {
            let e = o.as_ref().expect_err("every rank fails");
            if r != 2 {
                assert!(
                    matches!(e, CommError::Aborted { rank: 2, .. }),
                    "rank {r}: {e}"
                );
            }
        }
    }

    #[test]
    fn a_silent_rank_is_a_timeout_on_the_others_and_an_error_on_itself() {
        let bound = Duration::from_millis(300);
        let t0 = Instant::now();
        let out = run(3, bound, move |c| {
            if c.rank() == 1 {
                // Stalls past the bound, then arrives late: it must fail too, not wait.
                thread::sleep(bound * 3);
            }
            let mut b = [1.0f32];
            let r = c.all_reduce_sum(&mut b);
            std::mem::forget(c); // no drop-abort: this test is about the timeout alone
            r
        });
        assert!(t0.elapsed() < bound * 6, "{:?}", t0.elapsed());
        let timeouts = out
            .iter()
            .filter(|o| matches!(o, Err(CommError::Timeout { missing, .. }) if missing == &vec![1]))
            .count();
        assert!(timeouts >= 1, "{out:?}");
        assert!(out.iter().all(|o| o.is_err()), "{out:?}");
    }

    #[test]
    fn a_dropped_rank_aborts_the_group() {
        let out = run(2, Duration::from_secs(30), |c| {
            if c.rank() == 0 {
                drop(c);
                return Ok(());
            }
            let mut b = [1.0f32];
            c.all_reduce_sum(&mut b)
        });
        assert!(matches!(out[1], Err(CommError::Aborted { rank: 0, .. })));
    }

    #[test]
    fn mismatched_collectives_are_an_error_on_every_rank() {
        let out = run(2, Duration::from_secs(5), |c| {
            let mut b = vec![0f32; 1 + c.rank()];
            c.all_reduce_sum(&mut b)
        });
        assert!(out.iter().all(|o| o.is_err()), "{out:?}");
    }

    #[test]
    fn one_rank_is_the_identity() {
        let c = LoopbackGroup::ranks(1, Duration::from_millis(10)).remove(0);
        let mut b = [1.5f32, -2.0];
        c.all_reduce_sum(&mut b).unwrap();
        assert_eq!(b, [1.5, -2.0]);
        let mut r = [0f32; 2];
        c.all_gather(&b, &mut r).unwrap();
        assert_eq!(r, b);
    }
}
