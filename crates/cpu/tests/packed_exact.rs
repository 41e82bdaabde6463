//! Gate: the kernels of rows packed 16 at a time (`simd/x86/avx512_*_x16.rs` and
//! `avx2_*_x16.rs`, one layout for both) give every row the bits of the scalar reference dot
//! (`minfer_gguf::quants::vec_dot`) on its plain bytes, on every instruction set this machine
//! runs, for one activation row a call and for four.
//!
//! - `packed_kernels_are_exact_on_every_isa` calls each instruction set's kernels directly
//!   (`simd::x16_kernel_on`), on random blocks and on blocks whose quant and scale bytes are
//!   all at one extreme (0x00, 0xff, 0x80, 0x7f: the largest nibbles and six-bit quants, Q8_0
//!   weights of -128, Q6_K scales of -128), against activations quantized from random rows
//!   and from constant ones (all +1 or -1: Q8_K quants of -128 and Q8_0 ones of ±127, the
//!   largest `vpmaddubsw` pairs the AVX2 kernels' i16 sums are bounded for), and for Q8_0
//!   activations raw rows quantizing never makes (every quant -128, every quant 127, blocks
//!   of each in turn: Σ q = ±4096 / 4064 a block). Where a type has the form reading each
//!   activation block's d and Σ q from the matmul's side table (`X16Fns::facts`: Q4_0, Q5_0,
//!   Q8_0, whose kernels take back their weights' bias as a multiple of Σ q), that form is
//!   held to the same reference values, with the facts `TileSide::fill_rows` makes of the
//!   same rows (what the matmul hands it), one and four rows a call. Where a type has the
//!   prompt form (`X16Fns::wide`: AVX2 Q4_K, Q5_0 and Q6_K, each of which must be there),
//!   each group is expanded by it and its four-row kernel held to the same values.
//! - `facts_kernels_see_a_wrong_sum_or_d`: the permanent control of the facts forms: one
//!   block's Σ q off by one, or its d doubled, changes every row of the group (whose d is not
//!   zero) away from the reference's bits, and the true facts give them again.
//! - `packed_matmul_on_avx2` runs the matmul on packed weights with the instruction set
//!   forced to AVX2 (`MINFER_CPU_ISA=avx2`, in a child process of this test binary: the
//!   instruction set is chosen once per process), so the AVX2 dispatch of packed weights
//!   runs on AVX-512 machines too; `packed_matmul_on_the_isa_in_use` is what the child runs
//!   (and what the parent runs on the best instruction set). `tests/split_exact.rs` runs its
//!   packed tests on the best instruction set; under `MINFER_CPU_ISA=avx2` on AVX2's.
//!
//! Controls (2026-12-07, the Zen 4 VM with AVX-512 VNNI, each tried on the AVX2 kernels and
//! taken out again):
//! - Q5_0's float part as d_w · (d_a · s) instead of (d_w · d_a) · s failed the direct test
//!   (random blocks) and, under `MINFER_CPU_ISA=avx2`, split_exact's
//!   `legacy_float_orders_hold_on_large_block_sums`;
//! - Q4_K reading the d of the other half's rows failed the direct test and
//!   `packed_matmul_on_avx2`;
//! - Q5_0's 8 `vpmaddubsw` of a block summed in one i16 chain (past its 32767 bound) failed
//!   only the direct test, on the constant activations (the random rows of the matmul tests
//!   never saturate);
//! - the block lanes combined as (0 + 1) + (2 + 3), and Q6_K's offsets taken back as
//!   16 · Σ sc · bsum instead of 32 ·, each failed both.
//!
//! Controls of the facts forms (2026-12-07, the same VM, session 25, each taken out again):
//! - `x16::fact` handing every kernel Σ q + 1 failed every test here (the direct test first on
//!   `avx2 Q4_0 one, facts`; both matmul tests, the AVX2 child too, since the matmul reads the
//!   facts);
//! - AVX-512 Q5_0's facts form alone reading Σ q - 1 failed the direct test on
//!   `avx512vnni Q5_0 one, facts` and `packed_matmul_on_the_isa_in_use`, and left the AVX2
//!   child passing (each instruction set's kernels are checked on their own).
//!
//! Controls of the prompt form (2026-12-07, the same VM, session 26, each taken out again):
//! - AVX2 Q5_0's wide kernel computing d_w · (d_a · s) failed the direct test (`avx2 Q5_0
//!   four, wide`), `packed_matmul_on_avx2`, and under `MINFER_CPU_ISA=avx2` split_exact's
//!   `legacy_float_orders_hold_on_large_block_sums` and
//!   `packed_matmul_is_exact_for_every_thread_count`;
//! - its bias taken back as 16 · Σ q + 1 failed the direct test and `packed_matmul_on_avx2`;
//! - the expansion's two 4-element runs of each row swapped (the i32 unpacks' operands
//!   exchanged) failed the direct test (`four, wide`, first row) and `packed_matmul_on_avx2`;
//! - AVX2 Q6_K's wide kernel reading sub-block 8n + 2i + m % 2's scale (for m / 2), and its
//!   expansion storing the offsets' two pair-scale vectors of each word swapped, each failed
//!   the direct test (`avx2 Q6_K four, wide`) and `packed_matmul_on_avx2`.
//!
//! Controls of the Q4_K prompt form (2026-12-07, the same VM, session 27, each taken out
//! again): its expansion's second vector of each chunk blended with the wrong lanes (the
//! mask 0x55 for 0xaa), and its mins' pair sums read from lanes 0, 1, 2, 5 for 0, 1, 4, 5,
//! each failed the direct test (`avx2 Q4_K four, wide`, first row) and
//! `packed_matmul_on_avx2` (whose token counts reach Q4_K's `from`, 16, and past it).

use minfer_cpu::ops::matmul::packed::pack_x16;
use minfer_cpu::ops::matmul::{matmul, Layout, Weight};
use minfer_cpu::simd::{self, ActFacts, Isa, TileSide};
use minfer_gguf::quants::{self, random_blocks, vec_dot_type};
use minfer_gguf::GgmlType;
use minfer_testkit::exact::assert_bits_eq;
use minfer_testkit::reference;
use minfer_testkit::rng::floats;

const TYPES: [GgmlType; 6] = [
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::Q4_0,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_1,
];

/// The f16 scale fields of a block of `ty` (kept from the random block; the other bytes are
/// quants and packed scales, all valid at any value).
fn scale_bytes(ty: GgmlType) -> std::ops::Range<usize> {
    match ty {
        GgmlType::Q4K | GgmlType::Q4_1 => 0..4,
        GgmlType::Q6K => 208..210,
        _ => 0..2,
    }
}

/// `m` rows of `k` of `ty`: random blocks, every byte but the f16 scales set to `fill` when
/// there is one.
fn weights(ty: GgmlType, k: usize, m: usize, seed: u64, fill: Option<u8>) -> Vec<u8> {
    let mut w = random_blocks(ty, m * k / ty.block_size() as usize, seed);
    if let Some(f) = fill {
        let keep = scale_bytes(ty);
        for blk in w.chunks_exact_mut(ty.type_size() as usize) {
            for (i, b) in blk.iter_mut().enumerate() {
                if !keep.contains(&i) {
                    *b = f;
                }
            }
        }
    }
    w
}

/// Activation rows of `k`: random, all +1, all -1, and blocks of +1 and -1 in turn.
fn activation_rows(k: usize, seed: u64) -> Vec<Vec<f32>> {
    vec![
        floats(k, seed),
        vec![1.0; k],
        vec![-1.0; k],
        (0..k)
            .map(|i| if i / 32 % 2 == 0 { 1.0 } else { -1.0 })
            .collect(),
    ]
}

#[test]
fn packed_kernels_are_exact_on_every_isa() {
    let (mut checked, mut checked_facts) = (0, 0);
    let mut checked_wide = Vec::new();
    for isa in simd::available() {
        for ty in TYPES {
            let Some(x16) = simd::x16_kernel_on(isa, ty) else {
                continue;
            };
            let layout = Layout::packed_for(ty).unwrap();
            let at = vec_dot_type(ty);
            // k = 1280: 5 super-blocks (every block lane and lane 0 again), 40 legacy blocks.
            for (k, fill) in [
                (1280, None),
                (256, None),
                (1280, Some(0xff)),
                (1280, Some(0x00)),
                (1280, Some(0x80)),
                (1280, Some(0x7f)),
            ] {
                let m = 32;
                let wrb = ty.row_bytes(k as u64).unwrap() as usize;
                let plain = weights(ty, k, m, 41 + k as u64, fill);
                let packed = pack_x16(layout, &plain, k, m).unwrap();
                let arb = at.row_bytes(k as u64).unwrap() as usize;
                let mut acts: Vec<Vec<u8>> = activation_rows(k, 7 + k as u64)
                    .iter()
                    .map(|x| {
                        let mut a = vec![0u8; arb];
                        quants::quantize_row(at, x, &mut a).unwrap();
                        a
                    })
                    .collect();
                if at == GgmlType::Q8_0 {
                    acts.extend(extreme_q8_0_rows(k));
                }
                // The side table's per-row facts of these rows, as the matmul fills it.
                let mut side = TileSide::default();
                assert!(
                    side.fill_rows(at, &acts.concat(), arb),
                    "{ty}: facts of {at}"
                );
                let facts = |t: usize| {
                    let (d, sums) = side.row(t);
                    ActFacts { d, sums }
                };
                for g in 0..m / 16 {
                    let group = &packed[g * 16 * wrb..(g + 1) * 16 * wrb];
                    let want: Vec<Vec<f32>> = acts
                        .iter()
                        .map(|a| {
                            (0..16)
                                .map(|r| {
                                    let o = 16 * g + r;
                                    quants::vec_dot(ty, k, &plain[o * wrb..(o + 1) * wrb], a)
                                        .unwrap()
                                })
                                .collect()
                        })
                        .collect();
                    let what = |n: &str, t: usize| {
                        format!("{isa} {ty} {n} k={k} fill={fill:?} group {g} activation {t}")
                    };
                    for (t, a) in acts.iter().enumerate() {
                        let mut got = [f32::NAN; 16];
                        (x16.one)(group, a, &mut got);
                        assert_bits_eq(&got, &want[t], what("one", t));
                        if let Some(f) = x16.facts {
                            let mut got = [f32::NAN; 16];
                            (f.one)(group, a, facts(t), &mut got);
                            assert_bits_eq(&got, &want[t], what("one, facts", t));
                        }
                    }
                    // Four rows a call: the first four, and the last four (the extreme ones).
                    for t0 in [0, acts.len() - 4] {
                        let rows: [&[u8]; 4] = std::array::from_fn(|i| &acts[t0 + i][..]);
                        let mut got = [[f32::NAN; 16]; 4];
                        (x16.four)(group, rows, &mut got);
                        for t in 0..4 {
                            assert_bits_eq(&got[t], &want[t0 + t], what("four", t0 + t));
                        }
                        if let Some(f) = x16.facts {
                            let mut got = [[f32::NAN; 16]; 4];
                            (f.four)(
                                group,
                                rows,
                                std::array::from_fn(|i| facts(t0 + i)),
                                &mut got,
                            );
                            for t in 0..4 {
                                assert_bits_eq(&got[t], &want[t0 + t], what("four, facts", t0 + t));
                            }
                            checked_facts += 1;
                        }
                        if let Some(w) = x16.wide {
                            // The prompt form: the group expanded (into a buffer that starts
                            // off a cache line, as nothing promises more), then four rows.
                            let mut buf =
                                vec![0xa5u8; k / ty.block_size() as usize * w.block_bytes + 1];
                            let e = &mut buf[1..];
                            (w.expand)(group, e);
                            let mut got = [[f32::NAN; 16]; 4];
                            let f = std::array::from_fn(|i| facts(t0 + i));
                            (w.four)(e, rows, f, &mut got);
                            for t in 0..4 {
                                assert_bits_eq(&got[t], &want[t0 + t], what("four, wide", t0 + t));
                            }
                            checked_wide.push((isa, ty));
                        }
                    }
                    checked += 1;
                }
            }
        }
    }
    let x86 = simd::available().contains(&Isa::Avx2);
    assert!(
        checked > 0 || !x86,
        "no packed kernel ran on an AVX2 machine"
    );
    if x86 {
        assert!(checked_facts > 0, "no facts kernel ran on an AVX2 machine");
        // The prompt forms AVX2 has (none of them dropped from the lookup unnoticed), each
        // held to the reference above.
        for ty in [GgmlType::Q4K, GgmlType::Q5_0, GgmlType::Q6K] {
            assert!(
                checked_wide.contains(&(Isa::Avx2, ty)),
                "no AVX2 prompt form of {ty} ran"
            );
        }
        for ty in TYPES {
            let x16 = simd::x16_kernel_on(Isa::Avx2, ty);
            assert!(x16.is_some(), "{ty} on AVX2");
            // The types whose kernels take an activation sum have the form reading it.
            let biased = matches!(ty, GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0);
            assert_eq!(
                x16.unwrap().facts.is_some(),
                biased,
                "{ty}'s facts form on AVX2"
            );
        }
    }
}

/// Q8_0 activation rows of raw bytes at the extremes quantizing never makes: every quant
/// -128 (Σ q = -4096 a block: the largest products of the AVX2 kernels' i16 sums, and the
/// largest sum the offsets multiply), then every quant 127 and, in turn, blocks of -128 and
/// 127; d a different finite f16 per block.
fn extreme_q8_0_rows(k: usize) -> Vec<Vec<u8>> {
    let row = |q: &dyn Fn(usize) -> u8| {
        let mut a = Vec::with_capacity(k / 32 * 34);
        for b in 0..k / 32 {
            let d = quants::f32_to_f16(0.0078125 * (1.0 + b as f32 / 7.0));
            a.extend(d.to_le_bytes());
            a.extend(std::iter::repeat_n(q(b), 32));
        }
        a
    };
    vec![
        row(&|_| 0x80),
        row(&|_| 0x7f),
        row(&|b| if b % 2 == 0 { 0x80 } else { 0x7f }),
    ]
}

/// The control of the facts forms: the same kernels, handed facts with one block's Σ q off
/// by one, or its d doubled, give other values than the scalar reference's for the rows
/// of that group whose weights' d is not zero (so the gate above would fail on a kernel that
/// read a sum or a d one off), and the true facts give its values again.
#[test]
fn facts_kernels_see_a_wrong_sum_or_d() {
    let mut checked = 0;
    for isa in simd::available() {
        for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
            let Some(f) = simd::x16_kernel_on(isa, ty).and_then(|x| x.facts) else {
                continue;
            };
            let layout = Layout::packed_for(ty).unwrap();
            let (k, m) = (256, 16);
            let wrb = ty.row_bytes(k as u64).unwrap() as usize;
            let plain = weights(ty, k, m, 3, None);
            let packed = pack_x16(layout, &plain, k, m).unwrap();
            let at = vec_dot_type(ty);
            let mut a = vec![0u8; at.row_bytes(k as u64).unwrap() as usize];
            quants::quantize_row(at, &floats(k, 11), &mut a).unwrap();
            let mut side = TileSide::default();
            assert!(side.fill_rows(at, &a, a.len()));
            let (d, sums) = side.row(0);
            let want: Vec<f32> = (0..16)
                .map(|r| quants::vec_dot(ty, k, &plain[r * wrb..(r + 1) * wrb], &a).unwrap())
                .collect();
            let mut got = [f32::NAN; 16];
            (f.one)(&packed, &a, ActFacts { d, sums }, &mut got);
            assert_bits_eq(&got, &want, format_args!("{isa} {ty} true facts"));
            for b in [0, 3, 7] {
                let mut wrong_sums = sums.to_vec();
                wrong_sums[b] += 1;
                let mut wrong_d = d.to_vec();
                wrong_d[b] *= 2.0;
                for (what, facts) in [
                    (
                        "Σ q + 1",
                        ActFacts {
                            d,
                            sums: &wrong_sums,
                        },
                    ),
                    ("d · 2", ActFacts { d: &wrong_d, sums }),
                ] {
                    let mut got = [f32::NAN; 16];
                    (f.one)(&packed, &a, facts, &mut got);
                    let mut four = [[f32::NAN; 16]; 4];
                    (f.four)(&packed, [&a; 4], [facts; 4], &mut four);
                    for (r, w) in want.iter().enumerate() {
                        let dw = &plain[r * wrb + b * (wrb / (k / 32))..][..2];
                        if dw == [0, 0] || dw == [0, 0x80] {
                            continue;
                        }
                        assert_ne!(
                            got[r].to_bits(),
                            w.to_bits(),
                            "{isa} {ty} block {b} {what}: row {r} unchanged"
                        );
                        assert_eq!(four[3][r].to_bits(), got[r].to_bits(), "{isa} {ty} four");
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(
        checked > 0 || !simd::available().contains(&Isa::Avx2),
        "no facts kernel ran on an AVX2 machine"
    );
}

#[test]
fn packed_matmul_on_the_isa_in_use() {
    // Packed weights through the matmul, whatever the instruction set in use: the packed
    // kernels where it has them, a refusal where not. 43 rows: 2 groups and 11 plain rows.
    let isa = simd::detected();
    eprintln!("instruction set in use: {isa}");
    for ty in TYPES {
        let layout = Layout::packed_for(ty).unwrap();
        let (k, m) = (1280, 43);
        let plain = weights(ty, k, m, 5, None);
        let packed = pack_x16(layout, &plain, k, m).unwrap();
        let w = Weight {
            ty,
            k,
            m,
            bytes: &packed,
            layout,
        };
        if simd::x16_kernel(ty).is_none() {
            let mut out = vec![0f32; m];
            assert!(matmul(&w, &floats(k, 1), None, &mut out, 1).is_err());
            continue;
        }
        // Every count to 20 and two more: the prompt forms (`X16Fns::wide`) where a type has
        // one from its `from` (8 or 16) on, with 0-3 tokens past the last four; the packed
        // kernels below it.
        for nt in (1usize..=20).chain([33, 64]) {
            let x = floats(nt * k, 31 + nt as u64);
            let want = reference::matmul(ty, k, m, &plain, &x);
            for threads in [1, 2, 3] {
                let mut got = vec![f32::NAN; nt * m];
                matmul(&w, &x, None, &mut got, threads).unwrap();
                assert_bits_eq(
                    &got,
                    &want,
                    format_args!("{isa} {ty} nt={nt} threads={threads}"),
                );
            }
        }
    }
}

#[test]
fn packed_matmul_on_avx2() {
    if !Isa::Avx2.is_available() || std::env::var_os("MINFER_CPU_ISA").is_some() {
        eprintln!("SKIP: no AVX2 here, or the instruction set already forced");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .env("MINFER_CPU_ISA", "avx2")
        .args(["--exact", "packed_matmul_on_the_isa_in_use", "--nocapture"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the AVX2 run failed:\n{text}");
    assert!(
        text.contains("instruction set in use: avx2") && text.contains("1 passed"),
        "the child did not run the test on AVX2:\n{text}"
    );
}
