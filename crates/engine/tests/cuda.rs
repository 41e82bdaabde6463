//! Whole synthetic models on the CUDA backend (`--backend cuda`) against the f64 reference
//! forward and the CPU backend (issue 15's first slice). Every test prints SKIP and passes
//! where no CUDA device exists, so CI machines stay green; scripts/gpu-gate runs them on the
//! H200.
//!
//! Tolerance classes, named before measuring:
//! - The kernels read f32 activations against the weights' dequantized values, as the
//!   reference does; the only difference is f32 accumulation (and its order) against f64.
//!   Bar: max |dlogit| <= `ACC_TOL` (1e-3, the CPU's F32 bar), for every weight type.
//! - An f16 KV cache rounds every K/V value to f16 (rel 2^-11): bar 2% of the logits' RMS.
//!   A q8_0 cache rounds K/V to 8 bits per 32-value block, as the CPU's does: bar twice the
//!   CPU's own q8_0-cache error against the reference (plus ACC_TOL).
//! - One matmul kernel for every row count and attention per (head, query): a row's bits do
//!   not depend on its batch. Chunked vs unchunked prefill, a batch of 8 sequences vs each
//!   alone and three runs: bit for bit.
//! - Greedy tokens for 32 steps: identical to the CPU's where the CPU's arithmetic is f32 (F32
//!   and F16 weights). For quantized weights the CPU quantizes activations (Q8_0/Q8_1/Q8_K dot
//!   products) and the GPU does not, so there the bar is the f64 reference's greedy tokens and
//!   the CPU's agreement is reported (first measured: Q5_0 hd 64 parted from the CPU at step
//!   3 while matching the reference to 7e-7).
//! - The 0.5B-shaped model against the f64 reference on a short prompt: bar 5e-3 (deeper and
//!   wider than the tiny models; f32 accumulation only).

#![cfg(feature = "cuda")]

use minfer_cpu::CpuBackend;
use minfer_engine::{BatchEntry, Engine, EngineConfig};
use minfer_gguf::{GgmlType, GgufModel};
use minfer_graph::{Backend, KvLayout, RopeSpec, RopeStyle};
use minfer_models::{reference, Arch, HParams};
use minfer_testkit::synth::{self, Tiny};
use std::path::{Path, PathBuf};

const ACC_TOL: f64 = 1e-3;

/// Whether a CUDA device is here; prints SKIP when not.
fn gpu() -> bool {
    match minfer_cuda::available() {
        Ok(()) => true,
        Err(why) => {
            println!("SKIP: no CUDA device ({why})");
            false
        }
    }
}

fn tiny(arch: Arch, ty: GgmlType, head_dim: usize) -> PathBuf {
    let mut t = Tiny::new(arch, ty);
    t.d = 256;
    t.ff = 512;
    t.head_dim = head_dim;
    t.n_head = if arch == Arch::Qwen3 {
        4
    } else {
        256 / head_dim
    };
    t.n_head_kv = if t.n_head >= 4 { 2 } else { 1 };
    synth::write(&t)
}

fn engine(path: &Path, cuda: bool, cache: GgmlType, n_batch: usize) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx: 160,
            threads: 2,
            cache_type: cache,
            backends: vec![if cuda { "cuda" } else { "cpu" }.into()],
            n_batch,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

fn reference_logits(path: &Path, tokens: &[u32]) -> Vec<Vec<f64>> {
    let gguf = GgufModel::open(path).unwrap();
    let hp = HParams::from_metadata(gguf.metadata()).unwrap();
    reference::forward(&gguf, &hp, tokens).unwrap()
}

fn max_diff(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max((*x as f64 - y).abs()))
}

fn rms(v: &[Vec<f64>]) -> f64 {
    let n: usize = v.iter().map(|r| r.len()).sum();
    (v.iter().flatten().map(|x| x * x).sum::<f64>() / n as f64).sqrt()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Prefill all but the last 3 tokens (every row's logits), then decode one by one.
fn run_logits(e: &mut Engine, tokens: &[u32]) -> Vec<Vec<f32>> {
    let vocab = e.hparams().vocab_size;
    let split = tokens.len() - 3;
    let mut rows: Vec<Vec<f32>> = e
        .decode(&tokens[..split], 0, split)
        .unwrap()
        .chunks_exact(vocab)
        .map(<[f32]>::to_vec)
        .collect();
    for (i, &t) in tokens[split..].iter().enumerate() {
        rows.push(e.decode(&[t], split + i, 1).unwrap().to_vec());
    }
    rows
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
        .0 as u32
}

fn greedy(e: &mut Engine, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut out = Vec::new();
    let mut next = argmax(e.decode(prompt, 0, 1).unwrap());
    for i in 0..n {
        out.push(next);
        next = argmax(e.decode(&[next], prompt.len() + i, 1).unwrap());
    }
    out
}

/// Greedy tokens of the f64 reference forward (the whole sequence re-run each step).
fn reference_greedy(path: &Path, prompt: &[u32], n: usize) -> Vec<u32> {
    let gguf = GgufModel::open(path).unwrap();
    let hp = HParams::from_metadata(gguf.metadata()).unwrap();
    let mut seq = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let rows = reference::forward(&gguf, &hp, &seq).unwrap();
        let last = rows.last().unwrap();
        let next = last
            .iter()
            .enumerate()
            .fold((0, f64::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
            .0 as u32;
        out.push(next);
        seq.push(next);
    }
    out
}

fn long_prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7 + 3) % 40).collect()
}

const TOKENS: [u32; 9] = [1, 5, 9, 3, 33, 7, 2, 0, 39];

#[test]
fn every_arch_and_weight_type_matches_the_reference_and_the_cpu_greedy() {
    if !gpu() {
        return;
    }
    use GgmlType as T;
    let types = [
        T::F32,
        T::F16,
        T::Q8_0,
        T::Q4_0,
        T::Q4_1,
        T::Q5_0,
        T::Q4K,
        T::Q6K,
    ];
    for arch in Arch::ALL {
        for hd in [64, 128] {
            for ty in types {
                let path = tiny(arch, ty, hd);
                let want = reference_logits(&path, &TOKENS);
                let mut g = engine(&path, true, T::F32, 512);
                let c = g.nodes_per_backend(1).unwrap();
                let on_cpu = c.iter().find(|(n, _)| n == "cpu").map_or(0, |x| x.1);
                let on_gpu = c.iter().find(|(n, _)| n == "cuda").map_or(0, |x| x.1);
                assert!(on_cpu == 0 && on_gpu > 20, "{arch:?} {ty}: {c:?}");
                let got = run_logits(&mut g, &TOKENS);
                let d = got
                    .iter()
                    .zip(&want)
                    .fold(0f64, |x, (g, w)| x.max(max_diff(g, w)));
                println!(
                    "{arch:?} hd {hd} {ty}: cuda vs reference max |dlogit| {d:.3e} (rms {:.3})",
                    rms(&want)
                );
                assert!(d <= ACC_TOL, "{arch:?} hd {hd} {ty}: {d}");
                let mut c = engine(&path, false, T::F32, 512);
                let (gg, gc) = (greedy(&mut g, &TOKENS, 32), greedy(&mut c, &TOKENS, 32));
                let agree = gg.iter().zip(&gc).take_while(|(a, b)| a == b).count();
                if matches!(ty, T::F32 | T::F16) {
                    assert_eq!(gg, gc, "{arch:?} hd {hd} {ty}: greedy tokens vs the CPU");
                } else {
                    let gr = reference_greedy(&path, &TOKENS, 32);
                    println!(
                        "  greedy: cpu agrees for {agree}/32, reference {}",
                        gr == gg
                    );
                    assert_eq!(
                        gg, gr,
                        "{arch:?} hd {hd} {ty}: greedy tokens vs the reference"
                    );
                }
            }
        }
    }
}

#[test]
fn f16_and_q8_0_kv_caches_stay_in_their_class() {
    let gpu = gpu();
    for arch in Arch::ALL {
        let path = tiny(arch, GgmlType::F32, 64);
        let want = reference_logits(&path, &TOKENS);
        let diff = |rows: Vec<Vec<f32>>| {
            rows.iter()
                .zip(&want)
                .fold(0f64, |x, (g, w)| x.max(max_diff(g, w)))
        };
        let cpu_rows = run_logits(&mut engine(&path, false, GgmlType::Q8_0, 512), &TOKENS);
        let cpu_q8 = diff(cpu_rows.clone());
        println!("{arch:?} q8_0 KV on the CPU: max |dlogit| {cpu_q8:.3e}");
        if !gpu {
            continue;
        }
        for cache in [GgmlType::F16, GgmlType::Q8_0] {
            let rows = run_logits(&mut engine(&path, true, cache, 512), &TOKENS);
            if cache == GgmlType::Q8_0 {
                // Per row, against the CPU's q8_0 cache (the same rounding rule).
                let per: Vec<String> = rows
                    .iter()
                    .zip(&cpu_rows)
                    .map(|(g, c)| {
                        let d = g.iter().zip(c).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                        format!("{d:.1e}")
                    })
                    .collect();
                println!("{arch:?} q8_0 KV, cuda vs cpu per row: {}", per.join(" "));
            }
            let d = diff(rows);
            let bar = match cache {
                GgmlType::F16 => 0.02 * rms(&want),
                _ => 2.0 * cpu_q8 + ACC_TOL,
            };
            println!("{arch:?} {cache} KV: max |dlogit| {d:.3e}, bar {bar:.3e}");
            assert!(d <= bar, "{arch:?} {cache}: {d} > {bar}");
            assert!(d > 0.0, "the {cache} rounding is visible");
        }
    }
}

#[test]
fn chunked_prefill_is_bitwise_the_unchunked_one() {
    if !gpu() {
        return;
    }
    for arch in Arch::ALL {
        let path = tiny(arch, GgmlType::Q4K, 64);
        let prompt = long_prompt(100);
        let a = engine(&path, true, GgmlType::F16, 512)
            .decode(&prompt, 0, 1)
            .unwrap()
            .to_vec();
        let b = engine(&path, true, GgmlType::F16, 24)
            .decode(&prompt, 0, 1)
            .unwrap()
            .to_vec();
        let want = reference_logits(&path, &prompt);
        let r = max_diff(&a, want.last().unwrap());
        println!(
            "{arch:?}: chunked == whole: {}, whole vs reference {r:.3e}",
            bits(&a) == bits(&b)
        );
        assert_eq!(bits(&a), bits(&b), "{arch:?}: chunked vs whole");
        assert!(r <= 0.02 * rms(&want), "{arch:?}: {r}");
    }
}

#[test]
fn eight_sequences_batched_answer_bitwise_like_each_alone() {
    if !gpu() {
        return;
    }
    let path = tiny(Arch::Qwen2, GgmlType::Q8_0, 64);
    let prompts: Vec<Vec<u32>> = (0..8)
        .map(|i| long_prompt(70)[i..i + 4 + 3 * i].to_vec())
        .collect();
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| {
            engine(&path, true, GgmlType::F16, 512)
                .decode(p, 0, 1)
                .unwrap()
                .to_vec()
        })
        .collect();
    let mut e = engine(&path, true, GgmlType::F16, 512);
    let seqs: Vec<_> = (0..8).map(|_| e.seq_create()).collect();
    let entries: Vec<BatchEntry> = seqs
        .iter()
        .zip(&prompts)
        .map(|(&s, p)| BatchEntry::new(s, p, 0))
        .collect();
    let out = e.forward_batch(&entries).unwrap();
    for (i, a) in alone.iter().enumerate() {
        let same = bits(a) == bits(out.logits(i));
        println!("sequence {i}: batched == alone: {same}");
        assert!(same, "sequence {i}");
    }
    let other = engine(&path, true, GgmlType::F16, 512)
        .decode(&[4, 8, 16], 0, 1)
        .unwrap()
        .to_vec();
    assert_ne!(
        bits(&other),
        bits(&alone[0]),
        "control: another prompt differs"
    );
}

#[test]
fn three_runs_are_bit_identical() {
    if !gpu() {
        return;
    }
    let path = tiny(Arch::Qwen3, GgmlType::Q6K, 128);
    let prompt = long_prompt(70);
    let runs: Vec<Vec<u32>> = (0..3)
        .map(|_| {
            bits(
                engine(&path, true, GgmlType::F16, 512)
                    .decode(&prompt, 0, 1)
                    .unwrap(),
            )
        })
        .collect();
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], runs[2]);
}

/// KV region operations against the CPU backend's: copies bit for bit (overlapping both
/// ways), the re-rope of a shift within 1e-5 (f32) and one f16 ulp class (f16).
#[test]
fn kv_region_ops_match_the_cpu() {
    if !gpu() {
        return;
    }
    let mut g = minfer_cuda::CudaBackend::new(minfer_engine::backends::CUDA_ID, "cuda").unwrap();
    let mut c = CpuBackend::new(1);
    for (ty, tol) in [(GgmlType::F32, 1e-5f32), (GgmlType::F16, 2e-3)] {
        let (heads, hd, cells) = (2usize, 64usize, 40usize);
        let cell_bytes = ty.row_bytes((heads * hd) as u64).unwrap() as usize;
        let mut bytes = vec![0u8; cells * cell_bytes];
        let mut s = 12345u32;
        for (i, b) in bytes.iter_mut().enumerate() {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            // f16 bytes: keep exponents sane by masking the high byte of each half.
            *b = if ty == GgmlType::F16 && i % 2 == 1 {
                ((s >> 24) as u8 & 0x8f) | 0x30
            } else if ty == GgmlType::F32 && i % 4 == 3 {
                ((s >> 24) as u8 & 0x80) | 0x3e
            } else {
                (s >> 24) as u8
            };
        }
        let rg = g.alloc(bytes.len()).unwrap();
        let rc = c.alloc(bytes.len()).unwrap();
        g.write(rg, 0, &bytes).unwrap();
        c.write(rc, 0, &bytes).unwrap();
        for (src, dst, n) in [(0, 5, 20), (10, 2, 25), (30, 31, 9)] {
            g.kv_copy_cells(rg, cell_bytes, src, dst, n).unwrap();
            c.kv_copy_cells(rc, cell_bytes, src, dst, n).unwrap();
        }
        let layout = KvLayout {
            cache_type: ty,
            n_head_kv: heads,
            head_dim: hd,
            cell_bytes,
        };
        for style in [RopeStyle::Neox, RopeStyle::Normal] {
            let rope = RopeSpec {
                style,
                head_dim: hd,
                freq_base: 10000.0,
                freq_scale: 1.0,
            };
            g.kv_rope_shift(rg, &layout, &rope, 3, 30, -17).unwrap();
            c.kv_rope_shift(rc, &layout, &rope, 3, 30, -17).unwrap();
        }
        g.synchronize().unwrap();
        let (mut a, mut b) = (vec![0u8; bytes.len()], vec![0u8; bytes.len()]);
        g.read(rg, 0, &mut a).unwrap();
        c.read(rc, 0, &mut b).unwrap();
        let vals = |v: &[u8]| -> Vec<f32> {
            match ty {
                GgmlType::F32 => v
                    .chunks_exact(4)
                    .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                    .collect(),
                _ => v
                    .chunks_exact(2)
                    .map(|x| half::f16::from_le_bytes([x[0], x[1]]).to_f32())
                    .collect(),
            }
        };
        let (va, vb) = (vals(&a), vals(&b));
        let d = va
            .iter()
            .zip(&vb)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs() / y.abs().max(1.0)));
        println!("{ty} KV copy + shift: max rel diff {d:.3e} (bar {tol:.0e})");
        assert!(d <= tol, "{ty}: {d}");
        assert_ne!(a, bytes, "the ops changed the region");
    }
}

#[test]
fn the_pool_reuses_exact_lengths_zeroed_and_oom_is_an_error() {
    if !gpu() {
        return;
    }
    let mut g = minfer_cuda::CudaBackend::new(minfer_engine::backends::CUDA_ID, "cuda").unwrap();
    let a = g.alloc(1000).unwrap();
    g.write(a, 0, &[7u8; 1000]).unwrap();
    g.free(a);
    let b = g.alloc(999).unwrap();
    assert_ne!(a, b, "a different length is a different buffer");
    let c = g.alloc(1000).unwrap();
    assert_eq!(a, c, "the exact length is reused");
    let mut out = vec![1u8; 1000];
    g.read(c, 0, &mut out).unwrap();
    assert!(out.iter().all(|&x| x == 0), "a reused buffer is zeroed");
    let held = g.pool_bytes();
    g.free(c);
    assert_eq!(g.pool_bytes(), held, "freed buffers stay allocated");
    let e = g.alloc(1usize << 50).unwrap_err().to_string();
    println!("OOM: {e}");
    assert!(e.contains("asked") && e.contains("free"), "{e}");
    // The backend still works after the refusal.
    let d = g.alloc(64).unwrap();
    g.write(d, 0, &[3u8; 64]).unwrap();
    let mut o = [0u8; 64];
    g.read(d, 0, &mut o).unwrap();
    assert_eq!(o, [3u8; 64]);
}

/// A 0.5B-shaped model (MINFER_GATE_CUDA_MODEL, made by `minfer synth --preset 0.5b` on the
/// GPU machine): CUDA against the f64 reference on a short prompt (bar 5e-3), and against
/// the CPU (reported: the CPU quantizes activations for quantized weights, the GPU does not).
#[test]
fn a_half_b_model_agrees_with_the_cpu() {
    let Ok(path) = std::env::var("MINFER_GATE_CUDA_MODEL") else {
        println!("SKIP: MINFER_GATE_CUDA_MODEL is not set");
        return;
    };
    if !gpu() {
        return;
    }
    let load = |b: &str| {
        Engine::load(
            Path::new(&path),
            EngineConfig {
                n_ctx: 256,
                threads: 8,
                backends: vec![b.into()],
                ..EngineConfig::default()
            },
        )
        .unwrap()
    };
    let (mut g, mut c) = (load("cuda"), load("cpu"));
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 11) % 5000).collect();
    let a = g.decode(&prompt, 0, 1).unwrap().to_vec();
    let b = c.decode(&prompt, 0, 1).unwrap().to_vec();
    let d = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs() as f64));
    let r = (b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / b.len() as f64).sqrt();
    let (gg, gc) = (greedy(&mut g, &prompt, 16), greedy(&mut c, &prompt, 16));
    let same = gg.iter().zip(&gc).take_while(|(x, y)| x == y).count();
    println!("0.5B: cuda vs cpu max |dlogit| {d:.3e} (rms {r:.3}); greedy agree {same}/16");
    let short = &prompt[..6];
    let t0 = std::time::Instant::now();
    let want = reference_logits(Path::new(&path), short);
    let got = load("cuda").decode(short, 0, short.len()).unwrap().to_vec();
    let vocab = want[0].len();
    let dr = got
        .chunks_exact(vocab)
        .zip(&want)
        .fold(0f64, |m, (g, w)| m.max(max_diff(g, w)));
    println!(
        "0.5B: cuda vs f64 reference max |dlogit| {dr:.3e} over {} rows (reference {:.1} s)",
        short.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(dr <= 5e-3, "{dr}");
}

/// No weights (the KV and attention nodes read none).
struct NoWeights;

impl minfer_graph::WeightSource for NoWeights {
    fn weight(&self, _: minfer_graph::WeightId) -> Option<minfer_graph::WeightRef<'_>> {
        None
    }
    fn name(&self, _: minfer_graph::WeightId) -> &str {
        "-"
    }
    fn id(&self, _: &str) -> Option<minfer_graph::WeightId> {
        None
    }
    fn len(&self) -> usize {
        0
    }
}

/// KvStore then Attention (span windows) as single nodes on the GPU and on the CPU, for
/// every KV type: the stored regions bit for bit (the same rounding rule), the attention
/// outputs within 1e-5 relative (f32 order against the CPU's f64 scores), f16 within 4e-3
/// (the CPU's f16 attention rounds Q and its V accumulator to f16; first measured 1.0e-3).
#[test]
fn kv_store_and_attention_nodes_match_the_cpu() {
    use minfer_graph::{DType, KvKind, KvPair, Node, NodeId, Op, WindowLayout};
    if !gpu() {
        return;
    }
    let mut g = minfer_cuda::CudaBackend::new(minfer_engine::backends::CUDA_ID, "cuda").unwrap();
    let mut c = CpuBackend::new(1);
    let (n_head, n_kv, hd, nt, cells) = (4usize, 2usize, 64usize, 5usize, 16usize);
    let mut s = 99u32;
    let mut rnd = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    };
    let (kx, vx, q) = (
        rnd(n_kv * hd * nt),
        rnd(n_kv * hd * nt),
        rnd(n_head * hd * nt),
    );
    let f32b = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let i32b = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let cell_ids: Vec<i32> = (0..nt as i32).map(|t| 3 + 2 * t).collect();
    // Query t attends to cells [3, 3 + 2t + 1): its own and the earlier ones (and the gaps).
    let spans: Vec<i32> = (0..nt as i32).flat_map(|t| [3, 4 + 2 * t]).collect();
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
        let cb = ty.row_bytes((n_kv * hd) as u64).unwrap() as usize;
        let mut outs = Vec::new();
        for b in [&mut g as &mut dyn Backend, &mut c as &mut dyn Backend] {
            let mk = |b: &mut dyn Backend, data: &[u8]| {
                let id = b.alloc(data.len()).unwrap();
                b.write(id, 0, data).unwrap();
                id
            };
            let (kr, vr) = (b.alloc(cells * cb).unwrap(), b.alloc(cells * cb).unwrap());
            let kb = mk(b, &f32b(&kx));
            let vb = mk(b, &f32b(&vx));
            let cb_ = mk(b, &i32b(&cell_ids));
            let qb = mk(b, &f32b(&q));
            let wb = mk(b, &i32b(&spans));
            let out = b.alloc(n_head * hd * nt * 4).unwrap();
            let kv = Some(KvPair { k: kr, v: vr });
            let node = |op: Op, shape: [usize; 2], dtype: DType| Node {
                id: NodeId(0),
                name: "n".into(),
                op,
                src: Vec::new(),
                shape,
                dtype,
                backend: None,
                layer: None,
                dead: false,
            };
            for (kind, xb) in [(KvKind::K, kb), (KvKind::V, vb)] {
                let n = node(
                    Op::KvStore {
                        layer: 0,
                        kind,
                        cache_type: ty,
                    },
                    [n_kv * hd, nt],
                    DType::None,
                );
                let srcs = [Some(xb), Some(cb_)];
                let a = minfer_graph::ExecArgs {
                    srcs: &srcs,
                    out: None,
                    kv,
                    weights: &NoWeights,
                };
                b.execute_node(&n, &a).unwrap();
            }
            let n = node(
                Op::Attention {
                    layer: 0,
                    n_head,
                    n_head_kv: n_kv,
                    head_dim: hd,
                    scale: 0.125,
                    cache_type: ty,
                    window: WindowLayout::Span,
                },
                [n_head * hd, nt],
                DType::F32,
            );
            let srcs = [Some(qb), Some(wb)];
            let a = minfer_graph::ExecArgs {
                srcs: &srcs,
                out: Some(out),
                kv,
                weights: &NoWeights,
            };
            b.execute_node(&n, &a).unwrap();
            b.synchronize().unwrap();
            let (mut kbytes, mut vbytes) = (vec![0u8; cells * cb], vec![0u8; cells * cb]);
            b.read(kr, 0, &mut kbytes).unwrap();
            b.read(vr, 0, &mut vbytes).unwrap();
            let mut o = vec![0u8; n_head * hd * nt * 4];
            b.read(out, 0, &mut o).unwrap();
            outs.push((kbytes, vbytes, o));
        }
        let (gk, gv, go) = &outs[0];
        let (ck, cv, co) = &outs[1];
        if let Some(i) = (0..gk.len()).find(|&i| gk[i] != ck[i]) {
            let b0 = i / 34 * 34;
            println!(
                "{ty} K first difference at byte {i} (block byte {}): gpu {:?} cpu {:?}",
                i - b0,
                &gk[b0..b0 + 34],
                &ck[b0..b0 + 34]
            );
        }
        let kdiff = gk.iter().zip(ck).filter(|(a, b)| a != b).count();
        let vdiff = gv.iter().zip(cv).filter(|(a, b)| a != b).count();
        let f = |v: &[u8]| -> Vec<f32> {
            v.chunks_exact(4)
                .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                .collect()
        };
        let (go, co) = (f(go), f(co));
        let d = go
            .iter()
            .zip(&co)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs() / y.abs().max(1.0)));
        println!("{ty} KV: store bytes differing K {kdiff} V {vdiff}; attention max rel {d:.3e}");
        // The CPU's f16 attention is llama.cpp's arithmetic (f16 Q, f16 V accumulator).
        let bar = if ty == GgmlType::F16 { 4e-3 } else { 1e-5 };
        assert_eq!((kdiff, vdiff), (0, 0), "{ty}: stored regions");
        assert!(d <= bar, "{ty}: attention {d} > {bar}");
    }
}
