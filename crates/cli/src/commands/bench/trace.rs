//! `bench --trace FILE`: one untimed run of every test, traced per node, after the timed
//! repetitions. The timed runs are the same code with and without the flag: capture is armed
//! only around these extra runs, so the rows do not pay for it.

use super::{run_once, Target, Test};
use std::path::Path;

/// Runs each `(test, tokens, depth)` once from a cleared KV with the trace armed and writes
/// the trace to `path`; returns how many forwards it holds. Capture is disarmed again even
/// when a run fails.
pub fn traced_runs(
    target: &mut dyn Target,
    runs: &[(Test, Vec<u32>, Vec<u32>)],
    path: &Path,
) -> anyhow::Result<usize> {
    target.trace_begin()?;
    let ran = runs.iter().try_for_each(|(test, tokens, depth)| {
        run_once(target, *test, tokens, depth, &|_, _| {}).map(|_| ())
    });
    let written = target.trace_end(path);
    target.kv_clear();
    ran?;
    written
}
