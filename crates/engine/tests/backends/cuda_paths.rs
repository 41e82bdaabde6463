//! The CUDA backend's own arithmetic paths (rows of one backend): the f32 matmul against
//! the int8 path, CUDA-graph replay against eager launches, prompt rows (issue 26) and a
//! 0.5B-shaped model. Classes as named in `models.rs` (CUDA), and per case below.

use super::models::{long_prompt, max_rows_diff, reference_greedy, tiny, TOKENS};
use super::*;
use minfer_engine::BatchEntry;
use minfer_models::Arch;
use minfer_testkit::logits::*;
use minfer_testkit::synth;
use std::path::PathBuf;

const ACC_TOL: f64 = 1e-3;

/// The f32 matmul (`MINFER_CUDA_MATMUL=f32`) on every quantized type: the tight class, and
/// the control that the int8 path really is another path (its logits differ).
fn the_f32_matmul_path_stays_within_acc_tol_on_quantized_weights(row: &Row, _: &()) {
    for arch in Arch::ALL {
        for ty in super::models::CUDA_QUANT {
            let path = tiny(arch, ty, 64);
            let want = reference_logits(&path, &TOKENS);
            let int8 = run_logits(&mut row.engine(&path, GgmlType::F32, 512), &TOKENS);
            std::env::set_var("MINFER_CUDA_MATMUL", "f32");
            let mut e = row.engine(&path, GgmlType::F32, 512);
            std::env::remove_var("MINFER_CUDA_MATMUL");
            let f32 = run_logits(&mut e, &TOKENS);
            let d = max_rows_diff(&f32, &want);
            println!("{arch:?} {ty}: f32 matmul vs reference {d:.3e}");
            assert!(d <= ACC_TOL, "{arch:?} {ty}: {d}");
            assert_ne!(
                bits(&f32[0]),
                bits(&int8[0]),
                "{arch:?} {ty}: the int8 and f32 paths gave the same bits"
            );
            let gg = greedy(&mut e, &TOKENS, 32);
            assert_eq!(gg, reference_greedy(&path, &TOKENS, 32), "{arch:?} {ty}");
        }
    }
}

/// CUDA-graph replay of the decode step against eager launches (`MINFER_CUDA_GRAPHS=0`):
/// every step's logits bit for bit, and the replay counter shows the graphs ran.
fn replayed_decode_steps_are_bitwise_the_eager_ones(row: &Row, _: &()) {
    for (arch, ty) in [(Arch::Qwen2, GgmlType::Q4K), (Arch::Llama, GgmlType::Q6K)] {
        let path = tiny(arch, ty, 64);
        let steps = |e: &mut Engine| -> Vec<Vec<u32>> {
            let first = e.decode(&TOKENS, 0, 1).unwrap().to_vec();
            let mut tok = argmax(&first);
            let mut out = vec![bits(&first)];
            for i in 0..24 {
                let l = e
                    .decode_generated(&[tok], TOKENS.len() + i, 1)
                    .unwrap()
                    .to_vec();
                tok = argmax(&l);
                out.push(bits(&l));
            }
            out
        };
        std::env::set_var("MINFER_CUDA_GRAPHS", "0");
        let mut eager = row.engine(&path, GgmlType::F16, 512);
        std::env::remove_var("MINFER_CUDA_GRAPHS");
        let r0 = minfer_cuda::graph_replays();
        let a = steps(&mut eager);
        let r1 = minfer_cuda::graph_replays();
        let b = steps(&mut row.engine(&path, GgmlType::F16, 512));
        let r2 = minfer_cuda::graph_replays();
        println!(
            "{arch:?} {ty}: eager replays {}, replayed {}",
            r1 - r0,
            r2 - r1
        );
        assert_eq!(r1, r0, "the eager engine replayed graphs");
        assert!(r2 - r1 >= 20, "decode steps were not replayed: {}", r2 - r1);
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                x == y,
                "{arch:?} {ty}: step {i} differs between eager and replay"
            );
        }
    }
}

/// A 0.5B-shaped model (MINFER_GATE_CUDA_MODEL, made by `minfer synth --preset 0.5b` on the
/// GPU machine): CUDA against the CPU (reported), and against the f64 reference on a short
/// prompt: the f32 matmul path within 5e-3, the int8 path within 3x the CPU's own error
/// (both quantize activations to 8 bits) + 5e-3.
fn a_half_b_model_agrees_with_the_cpu(_: &Row, _: &()) {
    let Ok(path) = std::env::var("MINFER_GATE_CUDA_MODEL") else {
        println!("SKIP: MINFER_GATE_CUDA_MODEL is not set");
        return;
    };
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
    let vocab = want[0].len();
    let vs_ref = |e: &mut Engine| {
        let got = e.decode(short, 0, short.len()).unwrap().to_vec();
        got.chunks_exact(vocab)
            .zip(&want)
            .fold(0f64, |m, (g, w)| m.max(max_diff(g, w)))
    };
    let d8 = vs_ref(&mut load("cuda"));
    let dc = vs_ref(&mut load("cpu"));
    std::env::set_var("MINFER_CUDA_MATMUL", "f32");
    let d32 = vs_ref(&mut load("cuda"));
    std::env::remove_var("MINFER_CUDA_MATMUL");
    println!(
        "0.5B vs f64 reference over {} rows: cuda int8 {d8:.3e}, cuda f32 {d32:.3e}, cpu \
         {dc:.3e} (reference {:.1} s)",
        short.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(d32 <= 5e-3, "f32 path: {d32}");
    assert!(d8 <= 3.0 * dc + 5e-3, "int8 path: {d8} (cpu {dc})");
}

/// A tiny model with a 4096-token context (the prompt-row gates' long prompts).
fn long_ctx(arch: Arch, ty: GgmlType, head_dim: usize) -> PathBuf {
    ctx_model(arch, ty, head_dim, 4096)
}

/// A tiny model (d 256) with a context of `ctx` tokens.
fn ctx_model(arch: Arch, ty: GgmlType, head_dim: usize, ctx: usize) -> PathBuf {
    let mut t = synth::Tiny::new(arch, ty);
    t.d = 256;
    t.ff = 512;
    t.head_dim = head_dim;
    t.n_head = 256 / head_dim;
    t.n_head_kv = if t.n_head >= 4 { 2 } else { 1 };
    let tag = if ctx == 4096 {
        "ctx4k".to_string()
    } else {
        format!("ctx{ctx}")
    };
    synth::write_with(&t, &tag, |w| {
        w.set(
            format!("{}.context_length", arch.name()),
            minfer_gguf::Value::U32(ctx as u32),
        );
    })
}

fn long_engine(path: &Path, n_batch: usize) -> Engine {
    long_engine_kv(path, n_batch, GgmlType::F16)
}

fn long_engine_kv(path: &Path, n_batch: usize, cache: GgmlType) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx: 4096,
            cache_type: cache,
            backends: vec!["cuda".into()],
            n_batch,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

/// Prompt rows (issue 26, docs/PRECISION.md "Row classes"): a 2,100-token prompt prefilled in
/// chunks of 1, 7, 64, 512 and 2048 tokens and whole gives the same last-row logits bit for
/// bit (the pinned GEMM and the tensor-core attention at every chunk length), and a
/// sequence's prompt chunk shares a forward with another sequence's prompt chunk and a third
/// one's generation row without a bit changing. Control: a planted kernel choice by the
/// chunk's row count (`MINFER_CUDA_PROMPT_CONTROL=type-by-rows`: bf16 operands below 64
/// rows) changes the small chunkings' bits. (cuBLASLt's own heuristic per row count,
/// `MINFER_CUDA_GEMM_PIN=0`, changed none at this model's small shapes; the kernel gate
/// crates/cuda/tests/prompt.rs shows it at the 7B's.) The prompt rows against the f64 reference stay in the f16-operand
/// class (bar 2% of the logits' RMS, the f16 KV class).
fn prompt_rows_are_bitwise_equal_across_chunk_sizes_and_batch_company(_: &Row, _: &()) {
    for (arch, ty, hd) in [
        (Arch::Qwen2, GgmlType::Q4K, 128),
        (Arch::Llama, GgmlType::Q6K, 64),
    ] {
        prompt_rows_case(arch, ty, hd, GgmlType::F16);
    }
    prompt_rows_control(GgmlType::F16);
}

/// The same gate with a q8_0 KV cache (`--cache-type q8_0`): prompt rows on the tensor-core
/// flash attention reading q8_0 blocks (`mf_fa_q8_*`, head dim 128 and 64). Against the f64
/// reference the bar is the f16 class's plus twice the CPU's own error with a q8_0 cache
/// (the q8_0 rounding both make). Controls: the planted row-count choice is seen as for f16,
/// and `MINFER_CUDA_PROMPT_ATTN=rows` (the generation rows' kernels) gives other bits, so the
/// chunkings above really ran the q8_0 flash kernel.
fn q8_0_prompt_rows_are_bitwise_equal_across_chunk_sizes_and_batch_company(_: &Row, _: &()) {
    // The q8_0 flash kernels are the default since this gate passed (2026-12-06, H100):
    // unset is what users get; `rows` below is the other side.
    std::env::remove_var("MINFER_CUDA_PROMPT_ATTN");
    for (arch, ty, hd) in [
        (Arch::Qwen2, GgmlType::Q4K, 128),
        (Arch::Llama, GgmlType::Q6K, 64),
    ] {
        prompt_rows_case(arch, ty, hd, GgmlType::Q8_0);
        let path = long_ctx(arch, ty, hd);
        let prompt: Vec<u32> = (0..300u32).map(|i| (i * 7919 + 13) % 40).collect();
        let fa = bits(
            long_engine_kv(&path, 512, GgmlType::Q8_0)
                .decode(&prompt, 0, 1)
                .unwrap(),
        );
        std::env::set_var("MINFER_CUDA_PROMPT_ATTN", "rows");
        let rows = bits(
            long_engine_kv(&path, 512, GgmlType::Q8_0)
                .decode(&prompt, 0, 1)
                .unwrap(),
        );
        std::env::remove_var("MINFER_CUDA_PROMPT_ATTN");
        println!(
            "{arch:?} hd {hd} q8_0: flash == generation kernels: {}",
            fa == rows
        );
        assert_ne!(
            fa, rows,
            "{arch:?} hd {hd}: q8_0 prompt rows did not run the flash kernel"
        );
    }
    prompt_rows_control(GgmlType::Q8_0);
    std::env::remove_var("MINFER_CUDA_PROMPT_ATTN");
}

/// One model's chunkings, company and reference bar on a `cache` KV.
fn prompt_rows_case(arch: Arch, ty: GgmlType, hd: usize, cache: GgmlType) {
    // Written once: an engine still alive maps the file.
    let path = long_ctx(arch, ty, hd);
    let engine = |chunk: usize| long_engine_kv(&path, chunk, cache);
    let prompt: Vec<u32> = (0..2100u32).map(|i| (i * 7919 + 13) % 40).collect();
    let whole = bits(engine(4096).decode(&prompt, 0, 1).unwrap());
    for chunk in [1, 7, 64, 512, 2048] {
        let got = bits(engine(chunk).decode(&prompt, 0, 1).unwrap());
        println!(
            "{arch:?} {ty} hd {hd} {cache} KV: chunks of {chunk} == whole: {}",
            got == whole
        );
        assert!(got == whole, "{arch:?} {ty} {cache}: chunks of {chunk}");
    }
    // In company: sequence A's second chunk beside B's prompt chunk and C's generated row.
    let mut e = engine(4096);
    let (a, b, c) = (e.seq_create(), e.seq_create(), e.seq_create());
    let pa = &prompt[..300];
    e.forward_batch(&[BatchEntry::prompt(a, &pa[..100], 0, 0)])
        .unwrap();
    e.forward_batch(&[BatchEntry::prompt(c, &prompt[500..540], 0, 1)])
        .unwrap();
    let out = e
        .forward_batch(&[
            BatchEntry::prompt(b, &prompt[1000..1077], 0, 1),
            BatchEntry::prompt(a, &pa[100..], 100, 1),
            BatchEntry::generated(c, &[7], 40),
        ])
        .unwrap();
    let mixed = bits(out.logits(1));
    let alone = bits(engine(4096).decode(pa, 0, 1).unwrap());
    println!(
        "{arch:?} {cache} KV: in company == alone: {}",
        mixed == alone
    );
    assert!(
        mixed == alone,
        "{arch:?} {cache}: a prompt chunk among other rows"
    );
    // Against the f64 reference on a shorter prompt.
    let short = &prompt[..200];
    let got = engine(64).decode(short, 0, 1).unwrap().to_vec();
    let all = reference_logits(&path, short);
    let want = all.last().unwrap();
    let d = max_diff(&got, want);
    let bar = if cache == GgmlType::F16 {
        0.02 * rms(&all)
    } else {
        let cpu = Engine::load(
            &path,
            EngineConfig {
                n_ctx: 4096,
                cache_type: cache,
                backends: vec!["cpu".into()],
                ..EngineConfig::default()
            },
        )
        .unwrap()
        .decode(short, 0, 1)
        .unwrap()
        .to_vec();
        let dc = max_diff(&cpu, want);
        println!("{arch:?} {cache} KV on the CPU: vs reference {dc:.3e}");
        0.02 * rms(&all) + 2.0 * dc
    };
    println!(
        "{arch:?} {cache} KV: prompt rows vs reference {d:.3e} (rms {:.3}, bar {bar:.3e})",
        rms(&all)
    );
    assert!(d <= bar, "{arch:?} {cache}: {d}");
}

/// The control: a kernel choice by the chunk's row count makes the chunking visible.
fn prompt_rows_control(cache: GgmlType) {
    let path = long_ctx(Arch::Qwen2, GgmlType::Q4K, 128);
    let prompt: Vec<u32> = (0..2100u32).map(|i| (i * 7919 + 13) % 40).collect();
    std::env::set_var("MINFER_CUDA_PROMPT_CONTROL", "type-by-rows");
    let whole = bits(
        long_engine_kv(&path, 4096, cache)
            .decode(&prompt, 0, 1)
            .unwrap(),
    );
    let differ: Vec<usize> = [1, 7, 64, 512]
        .into_iter()
        .filter(|&c| {
            bits(
                long_engine_kv(&path, c, cache)
                    .decode(&prompt, 0, 1)
                    .unwrap(),
            ) != whole
        })
        .collect();
    std::env::remove_var("MINFER_CUDA_PROMPT_CONTROL");
    println!("control ({cache} KV): type by row count, chunkings {differ:?} differ from whole");
    // Chunks of 64 and 512 end in 52 rows, padded to the 64-row bucket: only 1 and 7 run
    // fewer than 64 rows.
    assert_eq!(differ, [1, 7], "control: the planted row-count choice");
}

/// Issue 26's long prompts as `minfer bench` runs them (forwards of 512, bench's `-b`):
/// pp8192 (windows to 8,192 keys: eight 1024-key splits of the prompt attention, a KV of
/// 8,704 cells) and pp512 at depth 4096, f16 and q8_0 KV. Gate: each runs, its last row's
/// logits are finite and the same bits when the prompt comes in forwards that end in a
/// 32-row tail (2720 for pp8192, 480 for the 512 after the depth). Control: the planted
/// row-count choice (`MINFER_CUDA_PROMPT_CONTROL=type-by-rows`) makes the tail's bits differ.
/// Sanity, no control of its own: the logits agree with the CPU engine's within the f16 KV
/// class (2% of the RMS; this random model's logits move little with the tokens, so the bar
/// is loose here: the chunking gate is the one that bites).
fn long_prompts_run_at_8192_and_at_depth_4096(_: &Row, _: &()) {
    let n_ctx = 8192 + 512;
    let path = ctx_model(Arch::Qwen2, GgmlType::Q4K, 128, n_ctx);
    let prompt: Vec<u32> = (0..8192u32).map(|i| (i * 7919 + 13) % 40).collect();
    let (depth, rest) = prompt.split_at(4096);
    // (name, depth tokens, timed tokens, a batch size whose last forward is 32 rows)
    let cases: [(&str, &[u32], &[u32], usize); 2] = [
        ("pp8192", &[], &prompt, 2720),
        ("pp512 @ d4096", depth, &rest[..512], 480),
    ];
    let run = |backend: &str, n_batch: usize, cache: GgmlType, pre: &[u32], toks: &[u32]| {
        let mut e = Engine::load(
            &path,
            EngineConfig {
                n_ctx,
                cache_type: cache,
                backends: vec![backend.into()],
                n_batch,
                ..EngineConfig::default()
            },
        )
        .unwrap();
        if !pre.is_empty() {
            e.decode(pre, 0, 1).unwrap();
        }
        e.decode(toks, pre.len(), 1).unwrap().to_vec()
    };
    for cache in [GgmlType::F16, GgmlType::Q8_0] {
        for (name, pre, toks, tail) in cases {
            let got = run("cuda", 512, cache, pre, toks);
            let tailed = run("cuda", tail, cache, pre, toks);
            let cpu: Vec<f64> = run("cpu", 512, cache, pre, toks)
                .iter()
                .map(|&x| x as f64)
                .collect();
            let bar = 0.02 * rms(std::slice::from_ref(&cpu));
            let d = max_diff(&got, &cpu);
            let finite = got.iter().all(|x| x.is_finite());
            println!(
                "{cache} KV {name}: finite {finite}, forwards of {tail} same bits {}, vs cpu \
                 {d:.3e} (bar {bar:.3e})",
                bits(&got) == bits(&tailed)
            );
            assert!(finite, "{cache} {name}: non-finite logits");
            assert!(
                bits(&got) == bits(&tailed),
                "{cache} {name}: forwards of {tail}"
            );
            assert!(d <= bar, "{cache} {name}: {d} > {bar}");
        }
    }
    // The control, on pp8192: the 32-row tail runs bf16 operands under the planted choice.
    std::env::set_var("MINFER_CUDA_PROMPT_CONTROL", "type-by-rows");
    let a = run("cuda", 512, GgmlType::F16, &[], &prompt);
    let b = run("cuda", 2720, GgmlType::F16, &[], &prompt);
    std::env::remove_var("MINFER_CUDA_PROMPT_CONTROL");
    println!(
        "control: type by row count, forwards of 2720 differ: {}",
        bits(&a) != bits(&b)
    );
    assert_ne!(
        bits(&a),
        bits(&b),
        "control: the planted row-count choice went unseen"
    );
}

/// Prompt rows and generation rows are separate classes: the prompt path really runs (a
/// prompt row's logits differ from the same token computed as a generation row, and from
/// the int8 kernels' `MINFER_CUDA_PROMPT=mmq`), and each class stays in its class against the
/// reference.
fn prompt_rows_run_their_own_kernels(_: &Row, _: &()) {
    let path = long_ctx(Arch::Qwen2, GgmlType::Q4K, 64);
    let p = long_prompt(60);
    let mut e = long_engine(&path, 512);
    e.decode(&p[..59], 0, 1).unwrap();
    let as_prompt = bits(e.decode(&p[59..], 59, 1).unwrap());
    let as_gen = bits(e.decode_generated(&p[59..], 59, 1).unwrap());
    std::env::set_var("MINFER_CUDA_PROMPT", "mmq");
    let mut m = long_engine(&path, 512);
    std::env::remove_var("MINFER_CUDA_PROMPT");
    let int8 = bits(m.decode(&p, 0, 1).unwrap());
    println!(
        "prompt == generation: {}, gemm == int8: {}",
        as_prompt == as_gen,
        as_prompt == int8
    );
    assert_ne!(
        as_prompt, as_gen,
        "a prompt row and a generation row gave the same bits"
    );
    assert_ne!(
        as_prompt, int8,
        "the GEMM and the int8 kernels gave the same bits"
    );
}

for_each_backend! {
    the_f32_matmul_path_stays_within_acc_tol_on_quantized_weights:
        the_f32_matmul_path_stays_within_acc_tol_on_quantized_weights { cuda => () }
    replayed_decode_steps_are_bitwise_the_eager_ones:
        replayed_decode_steps_are_bitwise_the_eager_ones { cuda => () }
    a_half_b_model_agrees_with_the_cpu: a_half_b_model_agrees_with_the_cpu { cuda => () }
    prompt_rows_are_bitwise_equal_across_chunk_sizes_and_batch_company:
        prompt_rows_are_bitwise_equal_across_chunk_sizes_and_batch_company { cuda => () }
    q8_0_prompt_rows_are_bitwise_equal_across_chunk_sizes_and_batch_company:
        q8_0_prompt_rows_are_bitwise_equal_across_chunk_sizes_and_batch_company { cuda => () }
    prompt_rows_run_their_own_kernels: prompt_rows_run_their_own_kernels { cuda => () }
    long_prompts_run_at_8192_and_at_depth_4096:
        long_prompts_run_at_8192_and_at_depth_4096 { cuda => () }
}
