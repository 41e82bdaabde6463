//! Ordered parallel encoding: pieces are encoded on worker threads in any order and handed
//! to one sink in piece order, so the output is the single-threaded output byte for byte.
//!
//! The sink (the file writer) runs on the calling thread while the workers encode the next
//! pieces, and at most `2 * threads` pieces are out at once (queued, being encoded or waiting
//! for an earlier one), which bounds memory whatever the number of pieces.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::{mpsc, Mutex};

/// Encodes piece `j` into the buffer (replacing its contents); the scratch row is the
/// worker's own, reused across its pieces.
pub type Encode<'a, E> = dyn Fn(usize, &mut Vec<f32>, &mut Vec<u8>) -> Result<(), E> + Sync + 'a;

/// Encodes pieces `0..n_pieces` on up to `threads` threads and passes each to `sink` in
/// order. The first error (from a piece, in order, or from the sink) stops the work and is
/// returned; pieces after it are not written.
pub fn encode_in_order<E: Send>(
    n_pieces: usize,
    threads: NonZeroUsize,
    encode: &Encode<'_, E>,
    sink: &mut dyn FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let workers = threads.get().min(n_pieces);
    if workers <= 1 {
        let (mut scratch, mut buf) = (Vec::new(), Vec::new());
        for j in 0..n_pieces {
            encode(j, &mut scratch, &mut buf)?;
            sink(&buf)?;
        }
        return Ok(());
    }
    let in_flight = 2 * workers;
    // A job is a piece index and a buffer to encode it into (recycled from a written piece).
    let (job_tx, job_rx) = mpsc::channel::<(usize, Vec<u8>)>();
    let job_rx = Mutex::new(job_rx);
    std::thread::scope(|s| {
        // Moved in, so that leaving this closure early (an error) closes the job queue and
        // the results channel, and every worker stops after its current piece.
        let job_tx = job_tx;
        let (done_tx, done_rx) = mpsc::channel::<(usize, Result<Vec<u8>, E>)>();
        for _ in 0..workers {
            let (done_tx, job_rx) = (done_tx.clone(), &job_rx);
            s.spawn(move || {
                let mut scratch = Vec::new();
                loop {
                    // The lock is held only while taking a job, never while encoding.
                    let job = job_rx.lock().expect("no worker panics holding it").recv();
                    let Ok((j, mut buf)) = job else { return };
                    let result = encode(j, &mut scratch, &mut buf).map(|()| buf);
                    if done_tx.send((j, result)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        let mut sent = 0;
        while sent < in_flight.min(n_pieces) {
            job_tx
                .send((sent, Vec::new()))
                .expect("workers live until the queue closes");
            sent += 1;
        }
        // Pieces finished ahead of the one the sink needs next.
        let mut ahead: BTreeMap<usize, Result<Vec<u8>, E>> = BTreeMap::new();
        for next in 0..n_pieces {
            let buf = loop {
                if let Some(r) = ahead.remove(&next) {
                    break r;
                }
                // Every sent piece not yet received is held by a live worker; a closed
                // channel means one panicked, and the scope re-raises that panic.
                let (j, r) = done_rx.recv().expect("a synth worker panicked");
                ahead.insert(j, r);
            }?;
            sink(&buf)?;
            if sent < n_pieces {
                job_tx
                    .send((sent, buf))
                    .expect("workers live until the queue closes");
                sent += 1;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(n: usize, threads: usize, fail_at: Option<usize>) -> (Vec<u8>, Result<(), String>) {
        let encode = |j: usize, _: &mut Vec<f32>, buf: &mut Vec<u8>| {
            if Some(j) == fail_at {
                return Err(format!("piece {j}"));
            }
            // Uneven work, so pieces finish out of order.
            let reps = (j * 7919) % 13;
            buf.clear();
            buf.extend((0..=reps).map(|r| (j * 31 + r) as u8));
            Ok(())
        };
        let mut out = Vec::new();
        let r = encode_in_order(
            n,
            NonZeroUsize::new(threads).unwrap(),
            &encode,
            &mut |b: &[u8]| {
                out.extend_from_slice(b);
                Ok(())
            },
        );
        (out, r)
    }

    #[test]
    fn output_is_in_piece_order_for_any_thread_count() {
        let (one, r) = run(500, 1, None);
        r.unwrap();
        // Control: the pieces really differ, so a reordering would show.
        assert!(one.len() > 500);
        for t in [2, 3, 8, 600] {
            let (many, r) = run(500, t, None);
            r.unwrap();
            assert_eq!(many, one, "{t} threads");
        }
    }

    #[test]
    fn the_first_error_stops_the_output_before_its_piece() {
        let (whole, _) = run(100, 1, None);
        let (part1, e1) = run(100, 1, Some(40));
        let (part4, e4) = run(100, 4, Some(40));
        assert_eq!(e1, Err("piece 40".into()));
        assert_eq!(e4, Err("piece 40".into()));
        assert_eq!(part4, part1);
        assert!(whole.starts_with(&part1) && part1.len() < whole.len());
        // No pieces at all is no output and no error.
        assert_eq!(run(0, 4, None), (Vec::new(), Ok(())));
    }
}
