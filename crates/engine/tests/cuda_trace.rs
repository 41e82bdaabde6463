//! The trace (`--trace`, `minfer_engine::trace`, ADR 0006) on the CUDA backend: each node's
//! output read back right after it ran, the split run eagerly while armed. Prints SKIP and
//! passes where no CUDA device exists; scripts/gpu-gate runs it on the H200.
//!
//! Tolerance class: F32 weights and KV, so both backends compute in f32 in different orders
//! (the CUDA f32 matmul's class, ADR 0008): each node's stats within 1e-4 of the node's scale
//! of the CPU's (the CPU-vs-Metal trace gate measured 6.9e-7 for the same class). Controls:
//! the traced forwards give the untraced logits bit for bit (capture reads, never perturbs),
//! and once disarmed the decode steps are replayed as CUDA graphs again.
//!
//! Node times (CUDA events around each node's launches, read after the forward's
//! synchronize): every traced CUDA node timed, non-zero, each forward's sum within its wall
//! time; none kept by an untraced or disarmed forward. Control: the check fails on the same
//! trace with one time dropped.

#![cfg(feature = "cuda")]

use minfer_engine::trace::Trace;
use minfer_engine::{Engine, EngineConfig};
use minfer_gguf::GgmlType;
use minfer_models::Arch;
use minfer_testkit::logits::bits;
use minfer_testkit::synth;
use std::path::Path;
use std::time::Instant;

const PROMPT: [u32; 5] = [3, 17, 99, 4, 60];
const DECODE: [u32; 3] = [21, 7, 40];

fn engine(path: &Path, backend: &str) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx: 64,
            threads: 1,
            cache_type: GgmlType::F32,
            backends: vec![backend.into()],
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

/// The prompt and the decode steps; the logits of each forward.
fn steps(e: &mut Engine) -> Vec<Vec<f32>> {
    let mut out = vec![e.decode(&PROMPT, 0, 1).unwrap().to_vec()];
    for (i, &t) in DECODE.iter().enumerate() {
        out.push(
            e.decode_generated(&[t], PROMPT.len() + i, 1)
                .unwrap()
                .to_vec(),
        );
    }
    out
}

fn traced(e: &mut Engine) -> (Trace, Vec<Vec<f32>>) {
    e.trace_begin().unwrap();
    let l = steps(e);
    (e.trace_end().unwrap().expect("a trace was begun"), l)
}

#[test]
fn cuda_traces_agree_with_the_cpu_and_leave_the_logits_alone() {
    match minfer_cuda::available() {
        Ok(()) => {}
        Err(why) => {
            println!("SKIP: no CUDA device ({why})");
            return;
        }
    }
    let path = synth::model(Arch::Qwen2, 2, 11);
    let (tc, _) = traced(&mut engine(&path, "cpu"));
    let plain = steps(&mut engine(&path, "cuda"));
    let mut g = engine(&path, "cuda");
    let (tg, lg) = traced(&mut g);
    for (i, (a, b)) in plain.iter().zip(&lg).enumerate() {
        assert_eq!(bits(a), bits(b), "forward {i}: tracing changed the logits");
    }
    assert!(tg.backends.iter().any(|b| b == "cuda"), "{:?}", tg.backends);
    assert_eq!(tg.phases.len(), tc.phases.len());
    let mut worst = 0f64;
    let mut compared = 0;
    for (k, (pc, pg)) in tc.phases.iter().zip(&tg.phases).enumerate() {
        assert_eq!(
            (pc.kind, pc.step, &pc.tokens),
            (pg.kind, pg.step, &pg.tokens)
        );
        let on_gpu = pg.nodes.iter().filter(|n| n.backend == "cuda").count();
        assert!(on_gpu > 20, "phase {k}: {on_gpu} nodes captured on cuda");
        assert!(pg.nodes.iter().all(|n| n.op != "KvStore"), "phase {k}");
        for a in &pc.nodes {
            // Fused decode nodes keep the name of the chain's last node.
            let Some(b) = pg.nodes.iter().find(|b| b.name == a.name) else {
                continue;
            };
            assert_eq!(a.shape, b.shape, "phase {k} {}", a.name);
            assert_eq!((a.nan, a.inf), (b.nan, b.inf), "phase {k} {}", a.name);
            let scale = (a.min.abs().max(a.max.abs()) as f64).max(1e-6);
            for (x, y) in [
                (a.min as f64, b.min as f64),
                (a.max as f64, b.max as f64),
                (a.mean, b.mean),
                (a.absmean, b.absmean),
            ] {
                let rel = (x - y).abs() / scale;
                worst = worst.max(rel);
                assert!(rel <= 1e-4, "phase {k} {}: {x} vs {y}", a.name);
            }
            compared += 1;
        }
        assert_eq!(pg.top5[0].0, pc.top5[0].0, "phase {k}: top token");
    }
    println!("{compared} nodes compared, worst stat difference / node scale {worst:.3e}");
    assert!(compared > 60, "only {compared} common nodes");
    // Disarmed, the decode steps replay as graphs again.
    let r0 = minfer_cuda::graph_replays();
    for i in 0..4 {
        g.decode_generated(&[5], PROMPT.len() + DECODE.len() + i, 1)
            .unwrap();
    }
    let replays = minfer_cuda::graph_replays() - r0;
    println!("replays after the trace: {replays}");
    assert!(
        replays >= 2,
        "the decode steps were not replayed after the trace"
    );
}

/// Per phase, the sum of the CUDA nodes' times; an error names a CUDA node without a
/// non-zero time.
fn cuda_times(t: &Trace) -> Result<Vec<(usize, u64)>, String> {
    let mut out = Vec::new();
    for (k, p) in t.phases.iter().enumerate() {
        let (mut n, mut sum) = (0, 0u64);
        for s in p.nodes.iter().filter(|s| s.backend == "cuda") {
            match s.ns {
                Some(ns) if ns > 0 => {
                    n += 1;
                    sum += ns;
                }
                other => return Err(format!("phase {k} {} ({}): ns {other:?}", s.name, s.op)),
            }
        }
        out.push((n, sum));
    }
    Ok(out)
}

#[test]
fn cuda_node_times_cover_every_launching_node_within_the_forward() {
    match minfer_cuda::available() {
        Ok(()) => {}
        Err(why) => {
            println!("SKIP: no CUDA device ({why})");
            return;
        }
    }
    let path = synth::model(Arch::Qwen2, 2, 11);
    let mut g = engine(&path, "cuda");
    g.decode(&PROMPT, 0, 1).unwrap();
    assert!(
        g.take_node_times().is_empty(),
        "an untraced forward keeps no times"
    );
    g.kv_clear();
    g.trace_begin().unwrap();
    // Each forward's wall time, host side, around the whole call.
    let mut walls = Vec::new();
    let t0 = Instant::now();
    g.decode(&PROMPT, 0, 1).unwrap();
    walls.push(t0.elapsed().as_nanos() as u64);
    for (i, &t) in DECODE.iter().enumerate() {
        let t0 = Instant::now();
        g.decode_generated(&[t], PROMPT.len() + i, 1).unwrap();
        walls.push(t0.elapsed().as_nanos() as u64);
    }
    let mut t = g.trace_end().unwrap().expect("a trace was begun");
    let cuda = t.timing.iter().find(|(b, _)| b == "cuda");
    let what = &cuda.expect("the trace says what CUDA's times are").1;
    assert!(what.contains("CUDA events"), "{what}");
    let sums = cuda_times(&t).unwrap();
    assert_eq!(sums.len(), walls.len());
    for (k, ((n, sum), wall)) in sums.iter().zip(&walls).enumerate() {
        println!(
            "phase {k}: {n} cuda nodes timed, {:.1} us of events in a {:.1} us forward",
            *sum as f64 / 1e3,
            *wall as f64 / 1e3
        );
        assert!(*n > 20, "phase {k}: {n} cuda nodes timed");
        assert!(
            sum <= wall,
            "phase {k}: node times {sum} ns > the forward's {wall} ns"
        );
    }
    // Disarmed: the next forwards (replayed again) leave no times.
    g.decode_generated(&[5], PROMPT.len() + DECODE.len(), 1)
        .unwrap();
    assert!(g.take_node_times().is_empty(), "disarmed: no times");
    // The control: the check fails on the trace with one CUDA node's time dropped.
    let i = t.phases[1]
        .nodes
        .iter()
        .position(|s| s.backend == "cuda")
        .unwrap();
    t.phases[1].nodes[i].ns = None;
    assert!(cuda_times(&t).is_err());
}
