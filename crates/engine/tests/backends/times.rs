//! Per-node times in a traced forward (docs/TRACE.md) on the Metal row: the emulator's span
//! clock here, the GPU's timestamp counters on a Mac (`MINFER_GATE_METAL_BACKEND=metal`,
//! scripts/mac-gate), where this is the only run of the real device's span clock.
//!
//! Every node of the row's backend carries a non-zero time, each forward's sum is within the
//! forward's host wall time, and the trace's `timing` names the row's clock; untraced and
//! disarmed forwards keep none. Control: the same check fails on the trace with one time
//! dropped, and on a forward wall time smaller than the node times.

use super::*;
use minfer_engine::trace::Trace;
use minfer_models::Arch;
use minfer_testkit::synth;
use std::time::Instant;

const PROMPT: [u32; 5] = [3, 17, 99, 4, 60];
const DECODE: [u32; 3] = [21, 7, 40];

/// Per phase, the `backend` nodes timed and their sum, each sum within that forward's wall
/// time; an error names a node without a non-zero time or a phase over its wall time.
fn timed_within(t: &Trace, backend: &str, walls: &[u64]) -> Result<Vec<(usize, u64)>, String> {
    if t.phases.len() != walls.len() {
        return Err(format!(
            "{} phases, {} forwards",
            t.phases.len(),
            walls.len()
        ));
    }
    let mut out = Vec::new();
    for (k, (p, wall)) in t.phases.iter().zip(walls).enumerate() {
        let (mut n, mut sum) = (0, 0u64);
        for s in p.nodes.iter().filter(|s| s.backend == backend) {
            match s.ns {
                Some(ns) if ns > 0 => {
                    n += 1;
                    sum += ns;
                }
                other => return Err(format!("phase {k} {} ({}): ns {other:?}", s.name, s.op)),
            }
        }
        if sum > *wall {
            return Err(format!(
                "phase {k}: node times {sum} ns > the forward's {wall} ns"
            ));
        }
        out.push((n, sum));
    }
    Ok(out)
}

fn every_node_is_timed_within_its_forward(row: &Row, _: &()) {
    let backend = row.backend();
    let path = synth::model(Arch::Qwen2, 2, 11);
    let mut e = row.engine(&path, GgmlType::F32, 512);
    e.decode(&PROMPT, 0, 1).unwrap();
    assert!(
        e.take_node_times().is_empty(),
        "an untraced forward keeps no times"
    );
    e.kv_clear();
    e.trace_begin().unwrap();
    // Each forward's wall time, host side, around the whole call.
    let mut walls = Vec::new();
    let t0 = Instant::now();
    e.decode(&PROMPT, 0, 1).unwrap();
    walls.push(t0.elapsed().as_nanos() as u64);
    for (i, &t) in DECODE.iter().enumerate() {
        let t0 = Instant::now();
        e.decode_generated(&[t], PROMPT.len() + i, 1).unwrap();
        walls.push(t0.elapsed().as_nanos() as u64);
    }
    let mut t = e.trace_end().unwrap().expect("a trace was begun");
    let what = &t
        .timing
        .iter()
        .find(|(b, _)| *b == backend)
        .unwrap_or_else(|| {
            panic!(
                "the trace does not say what {backend}'s times are: {:?}",
                t.timing
            )
        })
        .1;
    // Which clock: the GPU's counters on the device, the emulator's wall time here.
    let clock = if backend == "metal" {
        "timestamp counter"
    } else {
        "emulator"
    };
    assert!(what.contains(clock), "{backend}: {what}");
    let sums = timed_within(&t, &backend, &walls).unwrap();
    for (k, ((n, sum), wall)) in sums.iter().zip(&walls).enumerate() {
        println!(
            "{backend} phase {k}: {n} nodes timed, {:.1} us of node times in a {:.1} us forward",
            *sum as f64 / 1e3,
            *wall as f64 / 1e3
        );
        assert!(*n >= 20, "phase {k}: {n} {backend} nodes timed");
    }
    // Disarmed: the next forward leaves no times behind.
    e.decode_generated(&[5], PROMPT.len() + DECODE.len(), 1)
        .unwrap();
    assert!(e.take_node_times().is_empty(), "disarmed: no times");
    // The controls: a forward shorter than its node times, then one time dropped.
    let mut short = walls.clone();
    short[1] = sums[1].1 - 1;
    assert!(timed_within(&t, &backend, &short).is_err());
    let i = t.phases[1]
        .nodes
        .iter()
        .position(|s| s.backend == backend)
        .unwrap();
    t.phases[1].nodes[i].ns = None;
    assert!(timed_within(&t, &backend, &walls).is_err());
}

for_each_backend! {
    /// Every node of the Metal row timed, each forward's sum within its wall time.
    node_times_cover_every_node_within_the_forward: every_node_is_timed_within_its_forward {
        metal_emu => (),
    }
}
