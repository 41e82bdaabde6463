//! Generation rows on the CUDA backend (issues 27 and 29): a sequence's decode step gives the
//! same bits alone (the one-token kernels `mf_mmvq1`, `mf_qkv1`, `mf_gate_up1`) as among 2 to
//! 12 generation rows (the multi-row vector kernels `mf_mmvqn*`, a warp per row over up to 8
//! tokens' activations, or the many-token kernels `mf_mmvq_*` / `mf_mmq_*`, which compute the
//! canonical block order their own way: eight lanes a row or tensor-core tiles, 4-byte
//! weight loads), whatever grid the one-token
//! kernels walk their rows with (`MINFER_CUDA_MV1_GRID`: one resident wave, a block per eight
//! rows, one block walking every row), whichever Q4_K load path they take
//! (`MINFER_CUDA_MV1=narrow`) and whether Q4_K and Q6_K rows take the pipelined walks (1, 2
//! or 4 stages, `MINFER_CUDA_MV1_PIPE`, `_PIPE_SHORT`) or the plain ones (`=0`). Prints SKIP
//! and passes where no CUDA device exists; scripts/gpu-gate runs it on the H200, one test per
//! process (the switches are read when an engine loads).
//!
//! Tolerance class: none. Every path computes each row's block contributions with the same
//! rounded operations and chains them in the same order (kernels/int8.cuh), so the bar is
//! bit equality. Controls: another generated token gives other bits (the comparison is not
//! of constants), and the kernel launch counters show that the alone and the batched steps
//! ran different kernels.

#![cfg(feature = "cuda")]

use minfer_engine::{BatchEntry, Engine, EngineConfig, FusionConfig};
use minfer_gguf::GgmlType;
use minfer_models::Arch;
use minfer_testkit::logits::bits;
use minfer_testkit::synth::{self, Tiny};
use std::path::{Path, PathBuf};

fn gpu() -> bool {
    match minfer_cuda::available() {
        Ok(()) => true,
        Err(why) => {
            println!("SKIP: no CUDA device ({why})");
            false
        }
    }
}

/// A model wide enough that a Q4_K row spans 7 and 14 superblocks (the 7B's 14 and 74 are
/// not multiples of the wide walk's four either), with a KV group of 7 query heads.
fn wide_model(arch: Arch, ty: GgmlType) -> PathBuf {
    wide_model_mix(arch, ty, None)
}

/// [`wide_model`] with `attn_v` and `ffn_down` of `mix` (a Q4_K_M-like mixture: Q/K/V over two
/// types in one fused launch).
fn wide_model_mix(arch: Arch, ty: GgmlType, mix: Option<GgmlType>) -> PathBuf {
    let mut t = Tiny::new(arch, ty);
    t.mix = mix;
    t.d = 1792;
    t.ff = 3584;
    t.head_dim = 64;
    t.n_head = 28;
    t.n_head_kv = 4;
    t.vocab = 300;
    synth::write(&t)
}

fn engine(path: &Path) -> Engine {
    engine_with(path, FusionConfig::ALL)
}

fn engine_with(path: &Path, fusion: FusionConfig) -> Engine {
    engine_full(path, fusion, 256)
}

fn engine_ctx(path: &Path, n_ctx: usize) -> Engine {
    engine_full(path, FusionConfig::ALL, n_ctx)
}

fn engine_full(path: &Path, fusion: FusionConfig, n_ctx: usize) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx,
            threads: 2,
            cache_type: GgmlType::F16,
            backends: vec!["cuda".into()],
            n_batch: 512,
            ..EngineConfig::default()
        }
        .with_fusion(fusion),
    )
    .unwrap()
}

fn prompt(i: usize) -> Vec<u32> {
    (0..3 + 2 * i)
        .map(|k| ((k * 37 + i * 11) % 299) as u32)
        .collect()
}

/// Launches of the one-token kernels so far: each with x quantized in shared memory or once
/// before it (`_gx`, MINFER_CUDA_MV1_X), on the plain walks or the pipelined ones (`_p4`,
/// `_p6`: MINFER_CUDA_MV1_PIPE).
fn one_token_launches() -> u64 {
    let plain: u64 = ["", "_gx"]
        .iter()
        .flat_map(|x| ["mf_mmvq1", "mf_qkv1", "mf_gate_up1"].map(|k| format!("{k}{x}")))
        .map(|k| minfer_cuda::launches(&k))
        .sum();
    plain + pipelined_launches()
}

/// Launches of the pipelined one-token kernels so far.
fn pipelined_launches() -> u64 {
    let mut n = 0;
    for k in ["mf_mmvq1", "mf_qkv1", "mf_qkv1r", "mf_gate_up1"] {
        for w in ["_p4", "_p6", "_p46"] {
            for x in ["", "_gx"] {
                n += minfer_cuda::launches(&format!("{k}{w}{x}"));
            }
        }
    }
    n
}

/// Launches of the pipelined Q/K/V kernels over Q4_K Q/K and Q6_K V so far (RoPE fused or
/// not).
fn mixed_qkv_launches() -> u64 {
    [
        "mf_qkv1_p46",
        "mf_qkv1_p46_gx",
        "mf_qkv1r_p46",
        "mf_qkv1r_p46_gx",
    ]
    .iter()
    .map(|k| minfer_cuda::launches(k))
    .sum()
}

/// Launches of the rope-fused Q/K/V kernels (`mf_qkv1r_*`) so far.
fn rope_fused_launches() -> u64 {
    let mut n = 0;
    for w in ["", "_p4", "_p6", "_p46"] {
        for x in ["", "_gx"] {
            n += minfer_cuda::launches(&format!("mf_qkv1r{w}{x}"));
        }
    }
    n
}

/// Launches of the multi-row vector kernels so far (every weight type).
fn multi_row_launches() -> u64 {
    [2, 4, 8]
        .iter()
        .map(|k| minfer_cuda::launches(&format!("mf_mmvqn{k}")))
        .sum()
}

/// Launches of the many-token int8 kernels of `ty` so far: the multi-row vector kernels,
/// the dp4a kernel and the tensor-core tiles (which of them a row count takes is the
/// backend's choice).
fn many_token_launches(ty: GgmlType) -> u64 {
    let t = ty.to_string().to_lowercase();
    ["", "_r128", "_t32", "_k8"]
        .iter()
        .map(|tile| minfer_cuda::launches(&format!("mf_mmq_{t}{tile}")))
        .sum::<u64>()
        + minfer_cuda::launches(&format!("mf_mmvq_{t}"))
        + multi_row_launches()
        + tensor_core_row_launches()
        + staged_row_launches()
}

/// Launches of the staged tensor-core generation kernels so far (every weight type).
fn staged_row_launches() -> u64 {
    let mut n = 0;
    for k in [
        "1_r1", "1_r2", "1_w16", "2_r1", "2_r2", "2_w16", "4_r1", "4_r2", "4_w16",
    ] {
        for t in ["q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k"] {
            n += minfer_cuda::launches(&format!("mf_mmvs{k}_{t}"));
        }
    }
    n
}

/// Launches of the tensor-core generation kernels so far (every weight type).
fn tensor_core_row_launches() -> u64 {
    ["1", "2", "4", "8", "1_m2", "2_m2", "4_m2"]
        .iter()
        .map(|k| minfer_cuda::launches(&format!("mf_mmvt{k}")))
        .sum()
}

/// Each of the first eight sequences prefilled alone, then one generated token: its
/// logits' bits, with the one-token kernels' launch count of the steps.
fn alone(path: &Path, token: u32) -> (Vec<Vec<u32>>, u64) {
    alone_n(path, token, 8)
}

fn alone_n(path: &Path, token: u32, n: usize) -> (Vec<Vec<u32>>, u64) {
    let mut out = Vec::new();
    let mut launched = 0;
    for i in 0..n {
        let p = prompt(i);
        let mut e = engine(path);
        e.decode(&p, 0, 1).unwrap();
        let before = one_token_launches();
        let l = e.decode_generated(&[token], p.len(), 1).unwrap().to_vec();
        launched += one_token_launches() - before;
        out.push(bits(&l));
    }
    (out, launched)
}

/// The eight sequences prefilled, then their generated tokens in one forward.
fn batched(path: &Path, token: u32, ty: GgmlType) -> (Vec<Vec<u32>>, u64, u64) {
    batched_n(path, token, ty, 8)
}

/// The first `n` sequences prefilled, then their generated tokens in one forward: the bits,
/// and the one-token and many-token kernels' launches of that step.
fn batched_n(path: &Path, token: u32, ty: GgmlType, n: usize) -> (Vec<Vec<u32>>, u64, u64) {
    let prompts: Vec<Vec<u32>> = (0..n).map(prompt).collect();
    let (got, one, [many, _]) = step_all(&mut engine(path), &prompts, token, || {
        [many_token_launches(ty), 0]
    });
    (got, one, many)
}

/// `prompts` prefilled as sequences of `e` in one forward, then `token` generated by each in
/// the next: that step's logits bits, and the one-token kernels' launches and `count`'s
/// growth in it.
fn step_all<const K: usize>(
    e: &mut Engine,
    prompts: &[Vec<u32>],
    token: u32,
    count: impl Fn() -> [u64; K],
) -> (Vec<Vec<u32>>, u64, [u64; K]) {
    let seqs: Vec<_> = prompts.iter().map(|_| e.seq_create()).collect();
    let entries: Vec<BatchEntry> = seqs
        .iter()
        .zip(prompts)
        .map(|(&s, p)| BatchEntry::new(s, p, 0))
        .collect();
    e.forward_batch(&entries).unwrap();
    let toks = [token];
    let step: Vec<BatchEntry> = seqs
        .iter()
        .zip(prompts)
        .map(|(&s, p)| BatchEntry::generated(s, &toks, p.len()))
        .collect();
    let (one0, c0) = (one_token_launches(), count());
    let out = e.forward_batch(&step).unwrap();
    let got = (0..prompts.len()).map(|i| bits(out.logits(i))).collect();
    let c = count();
    (
        got,
        one_token_launches() - one0,
        std::array::from_fn(|k| c[k] - c0[k]),
    )
}

/// The weight types every generation kernel walks its own way, each on an arch.
const CASES: [(Arch, GgmlType); 5] = [
    (Arch::Qwen2, GgmlType::Q4K),
    (Arch::Llama, GgmlType::Q6K),
    (Arch::Qwen2, GgmlType::Q8_0),
    (Arch::Llama, GgmlType::Q5_0),
    (Arch::Qwen2, GgmlType::Q4_0),
];

fn with_env<T>(vars: &[(&str, &str)], f: impl FnOnce() -> T) -> T {
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let r = f();
    for (k, _) in vars {
        std::env::remove_var(k);
    }
    r
}

#[test]
fn generation_rows_are_bitwise_alone_among_eight_and_on_every_grid() {
    if !gpu() {
        return;
    }
    // Every case, and Q4_K with V and the FFN down projection of Q6_K (Q4_K_M's mixture).
    // MINFER_GEN_TYPES (e.g. `q4_k,q6_k`) keeps the cases of those types, for a device call
    // that re-gates one walk's types in less time.
    let mixed = (Arch::Qwen2, GgmlType::Q4K, Some(GgmlType::Q6K));
    let only = std::env::var("MINFER_GEN_TYPES").unwrap_or_default();
    let kept = |ty: GgmlType| {
        only.is_empty() || only.split(',').any(|t| t.eq_ignore_ascii_case(ty.name()))
    };
    let cases = CASES.map(|(a, t)| (a, t, None)).into_iter().chain([mixed]);
    for (arch, ty, mix) in cases.filter(|c| kept(c.1)) {
        let path = wide_model_mix(arch, ty, mix);
        let (want, one_b, multi_b) = batched(&path, 17, ty);
        assert_eq!(one_b, 0, "{ty}: the batched step ran one-token kernels");
        assert!(
            multi_b > 0,
            "{ty}: the batched step never ran mf_mmvq_* / mf_mmq_*"
        );
        let variants: [(&str, &[(&str, &str)]); 6] = [
            ("wave", &[]),
            ("x quantized once", &[("MINFER_CUDA_MV1_X", "global")]),
            (
                "rows, plain walks",
                &[
                    ("MINFER_CUDA_MV1_GRID", "rows"),
                    ("MINFER_CUDA_MV1_PIPE", "0"),
                ],
            ),
            (
                "one block, 2 stages, 4 on short rows, 2 rows asked of L2 ahead, Q6_K bound to 3 blocks",
                &[
                    ("MINFER_CUDA_MV1_GRID", "1"),
                    ("MINFER_CUDA_MV1_PIPE", "2"),
                    ("MINFER_CUDA_MV1_PIPE_SHORT", "4"),
                    ("MINFER_CUDA_MV1_PIPE_AHEAD", "2"),
                    ("MINFER_CUDA_MV1_P6_BLOCKS", "3"),
                ],
            ),
            ("narrow walks", &[("MINFER_CUDA_MV1", "narrow")]),
            (
                "plain walks unrolled by 4, both prefetches",
                &[
                    ("MINFER_CUDA_MV1_PIPE", "0"),
                    ("MINFER_CUDA_MV1_UNROLL", "4"),
                    ("MINFER_CUDA_MV1_PREFETCH", "2"),
                ],
            ),
        ];
        // MINFER_GEN_VARIANTS (names' beginnings, comma-separated, e.g. `wave,narrow`) keeps
        // those, for a device call that re-gates some walks in less time.
        let only_v = std::env::var("MINFER_GEN_VARIANTS").unwrap_or_default();
        let variants = variants.into_iter().filter(|(name, _)| {
            only_v.is_empty() || only_v.split(',').any(|v| name.starts_with(v))
        });
        for (name, vars) in variants {
            let p0 = pipelined_launches();
            let m0 = mixed_qkv_launches();
            let (got, launched) = with_env(vars, || alone(&path, 17));
            assert!(launched > 0, "{ty} {name}: the one-token kernels never ran");
            // Control: the pipelined walks ran where they take the rows (Q4_K, Q6_K, switched
            // on), and not where they are off.
            let piped = pipelined_launches() > p0;
            let off = vars
                .iter()
                .any(|&(k, v)| (k, v) == ("MINFER_CUDA_MV1_PIPE", "0") || k == "MINFER_CUDA_MV1");
            let takes = matches!(ty, GgmlType::Q4K | GgmlType::Q6K) && !off;
            assert_eq!(piped, takes, "{ty} {name}: pipelined kernels ran: {piped}");
            // The mixture's Q/K/V took the two-type kernel (`_p46`), the case's reason to be.
            if mix.is_some() && takes {
                assert!(
                    mixed_qkv_launches() > m0,
                    "{ty}+{mix:?} {name}: no _p46 launch"
                );
            }
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let same = g == w;
                println!(
                    "{arch:?} {ty} (mix {mix:?}) {name}: sequence {i} alone == among eight: {same}"
                );
                assert!(same, "{arch:?} {ty} {name}: sequence {i}");
            }
        }
        let (other, _) = alone(&path, 18);
        assert_ne!(other[0], want[0], "{ty} control: another token differs");
    }
}

/// Every generation-row count the multi-row vector kernels take (2 to 8 in one pass of the
/// 2-, 4- or 8-slot kernel, 3 and 5 with slots to spare; 9 and 12 in two passes under
/// `MINFER_CUDA_MVN=16`) gives each sequence its bits alone, as the kernels they
/// replace do (`MINFER_CUDA_MVN=0`: the dp4a kernel below 8 rows, the tensor-core tiles from
/// 8). Controls: the launch counters show the multi-row kernels ran on the one side and not on
/// the other, and another token differs.
#[test]
fn multi_row_generation_kernels_keep_each_row_alone_bits() {
    if !gpu() {
        return;
    }
    for (arch, ty) in CASES {
        let path = wide_model(arch, ty);
        let (want, _) = alone_n(&path, 17, 12);
        // The one-token kernels both ways (x quantized per block in shared memory, this
        // model's rows being short, or once before the kernel): the same bits.
        let (gx, _) = with_env(&[("MINFER_CUDA_MV1_X", "global")], || alone_n(&path, 17, 4));
        let (sx, _) = with_env(&[("MINFER_CUDA_MV1_X", "shared")], || alone_n(&path, 17, 4));
        assert!(
            gx[..] == want[..4],
            "{arch:?} {ty}: one-token kernels over global x"
        );
        assert!(
            sx[..] == want[..4],
            "{arch:?} {ty}: one-token kernels over shared x"
        );
        // The tensor-core generation kernels off (they take 5 rows and up by default;
        // their own gate is below).
        for (n, mvn) in [
            (2, "8"),
            (3, "8"),
            (5, "8"),
            (8, "8"),
            (9, "16"),
            (12, "16"),
        ] {
            for (side, value) in [("multi-row", mvn), ("replaced", "0")] {
                let vars: &[(&str, &str)] = &[
                    ("MINFER_CUDA_MVN", value),
                    ("MINFER_CUDA_MVT", "0"),
                    ("MINFER_CUDA_MVS", "0"),
                ];
                let mvn0 = multi_row_launches();
                let (got, one, many) = with_env(vars, || batched_n(&path, 17, ty, n));
                let ran = multi_row_launches() - mvn0;
                println!(
                    "{arch:?} {ty} {n} rows, {side} kernels: multi-row launches {ran}, \
                     many-token {many}, one-token {one}"
                );
                assert_eq!(one, 0, "{ty} {n} {side}: one-token kernels ran");
                if side == "multi-row" {
                    assert!(ran > 0, "{ty} {n}: the multi-row kernels never ran");
                } else {
                    assert_eq!(ran, 0, "{ty} {n}: MINFER_CUDA_MVN=0 still ran them");
                    assert!(many > 0, "{ty} {n}: no many-token kernel ran");
                }
                for (i, g) in got.iter().enumerate() {
                    assert!(g == &want[i], "{arch:?} {ty} {n} rows {side}: sequence {i}");
                }
            }
        }
        let (other, _) = alone_n(&path, 18, 1);
        assert_ne!(other[0], want[0], "{ty} control: another token differs");
    }
}

/// Short prompts of distinct tokens (`i` < 299), so that 70 sequences fit one engine.
fn short_prompt(i: usize) -> Vec<u32> {
    vec![(i * 7 % 299) as u32, ((i * 13 + 5) % 299) as u32]
}

/// The sequences `idx` each alone in an engine of `n_ctx` cells (short prompts): their
/// generated token's logits bits.
fn alone_short(path: &Path, token: u32, idx: &[usize], n_ctx: usize) -> Vec<Vec<u32>> {
    idx.iter()
        .map(|&i| {
            let p = short_prompt(i);
            let mut e = engine_ctx(path, n_ctx);
            e.decode(&p, 0, 1).unwrap();
            let l = e.decode_generated(&[token], p.len(), 1).unwrap().to_vec();
            bits(&l)
        })
        .collect()
}

/// `n` sequences (short prompts) prefilled, then their generated tokens in one forward: the
/// bits, and that step's launches of the one-token kernels, of the tensor-core generation
/// kernels and of every many-token kernel of `ty`.
fn batched_short(
    path: &Path,
    token: u32,
    ty: GgmlType,
    n: usize,
    n_ctx: usize,
) -> (Vec<Vec<u32>>, u64, [u64; 3]) {
    let prompts: Vec<Vec<u32>> = (0..n).map(short_prompt).collect();
    step_all(&mut engine_ctx(path, n_ctx), &prompts, token, || {
        [
            tensor_core_row_launches(),
            staged_row_launches(),
            many_token_launches(ty),
        ]
    })
}

/// Most rows a matmul runs on the tensor-core generation kernels (crates/cuda matvec.rs
/// `MVT_MAX_ROWS`); more take the `mma` prefill tiles.
const MVT_MAX_ROWS: usize = 32;

/// Most rows a matmul runs on the staged tensor-core generation kernels (matvec.rs
/// `MVS_MAX_ROWS`).
const MVS_MAX_ROWS: usize = 64;

/// The tensor-core generation kernels (`mf_mmvt*`, issues 29 and 31: a block of 16 weight
/// rows and 8 to 64 tokens, a warp per residue of the canonical order) and the staged ones
/// (`mf_mmvs*`: 32 or 64 weight rows and 8 to 32 tokens a block, weights and activations
/// through shared memory) give every sequence of 5 to 32 (staged: 2 to 64) generation rows its
/// bits alone (the one-token kernels), across the 8-, 16- and 32-token tiles' borders, in 16-
/// and 32-row blocks (`MINFER_CUDA_MVT_TALL=1` puts every matrix on the latter) and 32- and
/// 64-row staged blocks and 32-row ones of 16 warps (8-token tiles from 2 rows), as the kernels
/// they replace do (`MINFER_CUDA_MVT=0`: the multi-row
/// vector kernels to 8 rows, the `mma` prefill tiles from 9); past their counts the tiles run
/// on every side. Controls: the launch counters show which kernels each side ran, and
/// another token differs.
#[test]
fn tensor_core_generation_rows_keep_each_row_alone_bits() {
    if !gpu() {
        return;
    }
    let n_ctx = 1024;
    let idx = [0, 1, 4, 7, 8, 15, 16, 31, 32, 47, 63, 64, 69];
    let cases = CASES.iter().copied().chain([(Arch::Llama, GgmlType::Q4_1)]);
    for (arch, ty) in cases {
        let path = wide_model(arch, ty);
        let want = alone_short(&path, 17, &idx, n_ctx);
        for n in [2, 3, 5, 8, 9, 16, 17, 32, 33, 64, 70] {
            let sides: [(&str, &[(&str, &str)]); 6] = [
                (
                    "tensor-core",
                    &[("MINFER_CUDA_MVT", "5"), ("MINFER_CUDA_MVS", "0")],
                ),
                (
                    "tensor-core, 32-row blocks",
                    &[
                        ("MINFER_CUDA_MVT", "5"),
                        ("MINFER_CUDA_MVT_TALL", "1"),
                        ("MINFER_CUDA_MVS", "0"),
                    ],
                ),
                (
                    "staged, 32-row blocks",
                    &[
                        ("MINFER_CUDA_MVS", "2"),
                        ("MINFER_CUDA_MVS_ROWS", "32"),
                        ("MINFER_CUDA_MVS_WARPS", "8"),
                    ],
                ),
                (
                    "staged, 32-row blocks of 16 warps",
                    &[
                        ("MINFER_CUDA_MVS", "2"),
                        ("MINFER_CUDA_MVS_ROWS", "32"),
                        ("MINFER_CUDA_MVS_WARPS", "16"),
                    ],
                ),
                (
                    "staged, 64-row blocks",
                    &[("MINFER_CUDA_MVS", "2"), ("MINFER_CUDA_MVS_ROWS", "64")],
                ),
                (
                    "replaced",
                    &[("MINFER_CUDA_MVT", "0"), ("MINFER_CUDA_MVS", "0")],
                ),
            ];
            for (side, vars) in sides {
                let (got, one, [mvt, mvs, many]) =
                    with_env(vars, || batched_short(&path, 17, ty, n, n_ctx));
                println!(
                    "{arch:?} {ty} {n} rows, {side}: tensor-core row launches {mvt}, staged \
                     {mvs}, many-token {many}, one-token {one}"
                );
                assert_eq!(one, 0, "{ty} {n} {side}: one-token kernels ran");
                let (ran, other, from, max) = if side.starts_with("staged") {
                    (mvs, mvt, 2, MVS_MAX_ROWS)
                } else {
                    (mvt, mvs, 5, MVT_MAX_ROWS)
                };
                // (A staged side leaves matrices whose rows its copies cannot align, the
                // 1,792-value Q6_K ones here, to the 16-row kernels.)
                if !side.starts_with("staged") {
                    assert_eq!(other, 0, "{ty} {n} {side}: the staged row kernels ran");
                }
                if side == "replaced" {
                    assert_eq!(ran, 0, "{ty} {n}: MINFER_CUDA_MVT=0 still ran them");
                    assert!(many > 0, "{ty} {n}: no many-token kernel ran");
                } else if n < from {
                    // Below 5 rows the 16-row kernels leave them to the multi-row vector
                    // kernels: only the bits are compared.
                } else if n <= max {
                    assert!(ran > 0, "{ty} {n} {side}: the row kernels never ran");
                } else {
                    assert_eq!(ran, 0, "{ty} {n} {side}: past {max} rows the tiles run");
                    assert!(many > 0, "{ty} {n}: no many-token kernel ran");
                }
                for (k, &i) in idx.iter().enumerate().filter(|(_, &i)| i < n) {
                    assert!(
                        got[i] == want[k],
                        "{arch:?} {ty} {n} rows {side}: sequence {i}"
                    );
                }
            }
        }
        let other = alone_short(&path, 18, &idx[..1], n_ctx);
        assert_ne!(other[0], want[0], "{ty} control: another token differs");
    }
}

/// The 7B's FFN (18,944 rows) is past Metal's gate|up concatenation cap; CUDA reads gate and
/// up where they are, so its decode graph fuses every layer's FFN (and folds the norm in).
/// Control: the same model with the FFN fusion off has none.
#[test]
fn an_ffn_past_the_concatenation_cap_is_fused_on_cuda() {
    if !gpu() {
        return;
    }
    let mut t = Tiny::new(Arch::Qwen2, GgmlType::Q4K);
    t.ff = minfer_graph::MAX_FUSED_FFN + 256;
    let path = synth::write(&t);
    let count = |e: &mut Engine| {
        let g = e.ops_in_graph(1).unwrap();
        g.iter().find(|(n, _)| *n == "FfnGateUp").map_or(0, |c| c.1)
    };
    let fused = count(&mut engine(&path));
    println!("ff {}: FfnGateUp nodes {fused}", t.ff);
    assert_eq!(fused, t.layers, "every layer's FFN fused");
    let no_ffn = FusionConfig {
        ffn: false,
        ..FusionConfig::ALL
    };
    let off = count(&mut engine_with(&path, no_ffn));
    assert_eq!(off, 0, "control: with the FFN fusion off nothing is fused");
}

/// The decode Q/K/V with RoPE and the KV stores in one launch (`mf_qkv1r_*`, kernels/fused.cu)
/// against the two launches it replaces (`mf_qkv1_*` + `mf_rope_store`,
/// `MINFER_CUDA_QKV_ROPE=0`): the same logits bit for bit over a prefill and six generated
/// steps, whose attention reads the K/V cells either path stored. NeoX pairs with biases
/// (Qwen2) and adjacent pairs (LLaMA), every pipelined walk (Q4_K, Q6_K, Q/K of Q4_K with V
/// of Q6_K) and the plain walks (Q5_0, Q8_0), f16 and f32 caches. Control: the launch
/// counters show the fused kernel ran every step in one engine and never in the other, where
/// `mf_rope_store` ran instead.
#[test]
fn the_rope_fused_qkv_gives_the_two_launches_bits() {
    if !gpu() {
        return;
    }
    use GgmlType as T;
    let cases = [
        (Arch::Qwen2, T::Q4K, None, T::F16),
        (Arch::Llama, T::Q4K, None, T::F32),
        (Arch::Qwen2, T::Q4K, Some(T::Q6K), T::F16),
        (Arch::Llama, T::Q6K, None, T::F16),
        // The plain walks (`mf_qkv1r`): the 0.5B shape's Q5_0, and Q8_0 on LLaMA's pairs.
        (Arch::Qwen2, T::Q5_0, None, T::F16),
        (Arch::Llama, T::Q8_0, None, T::F32),
    ];
    for (arch, ty, mix, cache) in cases {
        let path = wide_model_mix(arch, ty, mix);
        let run = |fused: &str| {
            with_env(&[("MINFER_CUDA_QKV_ROPE", fused)], || {
                let mut e = Engine::load(
                    &path,
                    EngineConfig {
                        n_ctx: 256,
                        threads: 2,
                        cache_type: cache,
                        backends: vec!["cuda".into()],
                        ..EngineConfig::default()
                    },
                )
                .unwrap();
                let (f0, s0) = (
                    rope_fused_launches(),
                    minfer_cuda::launches("mf_rope_store"),
                );
                let p = prompt(3);
                let first = e.decode(&p, 0, 1).unwrap().to_vec();
                let mut next = minfer_testkit::logits::argmax(&first);
                let mut out = vec![bits(&first)];
                for step in 0..6 {
                    let l = e
                        .decode_generated(&[next], p.len() + step, 1)
                        .unwrap()
                        .to_vec();
                    next = minfer_testkit::logits::argmax(&l);
                    out.push(bits(&l));
                }
                let launched = (
                    rope_fused_launches() - f0,
                    minfer_cuda::launches("mf_rope_store") - s0,
                );
                (out, launched)
            })
        };
        let what = format!("{arch:?} {ty} (V {mix:?}), {cache} KV");
        let (fused, (fk, fs)) = run("1");
        let (plain, (pk, ps)) = run("0");
        assert!(
            fk >= 6 && fs == 0,
            "{what}: fused run launched {fk} / rope_store {fs}"
        );
        assert!(
            pk == 0 && ps >= 6,
            "{what}: plain run launched {pk} / rope_store {ps}"
        );
        for (step, (a, b)) in fused.iter().zip(&plain).enumerate() {
            let diff = a.iter().zip(b).filter(|(x, y)| x != y).count();
            assert_eq!(diff, 0, "{what}: step {step} differs in {diff} logits");
        }
        println!("{what}: fused == two launches over 7 steps ({fk} fused launches)");
    }
}
