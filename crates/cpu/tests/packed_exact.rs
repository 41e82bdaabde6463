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
//!   largest `vpmaddubsw` pairs the AVX2 kernels' i16 sums are bounded for).
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

use minfer_cpu::ops::matmul::packed::pack_x16;
use minfer_cpu::ops::matmul::{matmul, Layout, Weight};
use minfer_cpu::simd::{self, Isa};
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
    let mut checked = 0;
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
                let acts: Vec<Vec<u8>> = activation_rows(k, 7 + k as u64)
                    .iter()
                    .map(|x| {
                        let mut a = vec![0u8; arb];
                        quants::quantize_row(at, x, &mut a).unwrap();
                        a
                    })
                    .collect();
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
                    }
                    let mut got = [[f32::NAN; 16]; 4];
                    (x16.four)(group, [&acts[0], &acts[1], &acts[2], &acts[3]], &mut got);
                    for t in 0..4 {
                        assert_bits_eq(&got[t], &want[t], what("four", t));
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
        for ty in TYPES {
            assert!(simd::x16_kernel_on(Isa::Avx2, ty).is_some(), "{ty} on AVX2");
        }
    }
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
        for nt in [1usize, 3, 4, 5, 9] {
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
