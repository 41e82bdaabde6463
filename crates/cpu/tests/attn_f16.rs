//! Gate for `llamacpp_x86::attn_f16` (llama.cpp's flash-attention arithmetic over an f16 cache):
//! - the kernel of every instruction set this machine has (AVX-512 for head sizes that are
//!   multiples of 32, AVX2/FMA/F16C) is bit-identical to the scalar reference, for head
//!   sizes with and without a tail past the last multiple of 32 / 8; so is the GQA-group
//!   kernel `attend_group_on`, head by head, over cells in any order;
//! - the reference is within the f16 accumulator's rounding of exact attention (f64 softmax
//!   over the same f16 values): each update rounds VKQ to f16 (relative 2^-11), so after n
//!   cells the error is bounded by about n · 2^-11 · max|v| in the worst case, and the
//!   roundings (half an f16 ulp, 2^-12 at |VKQ| ~ 1, independent in sign) walk as
//!   √n · 2^-12 = 4.2e-3 for n = 300: asserted at 4e-3 (`F16_ACC_TOL`); measured 5.2e-4
//!   (2026-12-01), 7.6x below (it was 0.02, 38x).
//!
//! Control (tried by hand): the scale multiplied by (1 + 2^-23) in the reference failed the
//! bit-identity test. Not a control: an unfused `h(x) * vs + h(a)` V update passes, because
//! fused and unfused f32 results round to the same f16 except in double-rounding corner
//! cases (a search over 450k (v0, v1) pairs found none), so that choice is immaterial.

use minfer_cpu::llamacpp_x86::attn_f16::{
    attend_group_on, attend_head_on, attend_head_ref, attend_tile_on, dot_ref,
};
use minfer_cpu::simd;
use minfer_gguf::quants::{f16_to_f32, f32_to_f16};
use minfer_testkit::rng::Rng;

const F16_ACC_TOL: f64 = 4e-3;

fn case(rng: &mut Rng, hd: usize, n: usize, amp: f32) -> (Vec<f32>, Vec<u16>, Vec<u16>) {
    let q: Vec<f32> = (0..hd).map(|_| rng.signed() * amp).collect();
    let k: Vec<u16> = (0..hd * n)
        .map(|_| f32_to_f16(rng.signed() * amp))
        .collect();
    let v: Vec<u16> = (0..hd * n).map(|_| f32_to_f16(rng.signed())).collect();
    (q, k, v)
}

#[test]
fn dispatched_kernel_is_bit_identical_to_reference() {
    let mut rng = Rng::xorshift64_raw(0x9e3779b97f4a7c15);
    let mut cases = 0;
    for hd in [64usize, 128, 40, 36, 8, 3] {
        for n in [1usize, 2, 7, 64, 300] {
            for amp in [0.5f32, 4.0] {
                let (q, k, v) = case(&mut rng, hd, n, amp);
                let kc = |c: usize| &k[c * hd..(c + 1) * hd];
                let vc = |c: usize| &v[c * hd..(c + 1) * hd];
                let mut want = vec![0f32; hd];
                attend_head_ref(&q, 0.125, 0..n, kc, vc, &mut want);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                for isa in simd::available() {
                    let mut got = vec![1f32; hd];
                    attend_head_on(isa, &q, 0.125, 0..n, kc, vc, &mut got);
                    assert_eq!(bits(&got), bits(&want), "{isa} hd {hd} n {n} amp {amp}");
                }
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 60);
}

#[test]
fn reference_is_within_f16_accumulation_of_exact_attention() {
    let mut rng = Rng::xorshift64_raw(7);
    let mut worst = 0f64;
    for hd in [64usize, 40] {
        for n in [1usize, 5, 300] {
            let (q, k, v) = case(&mut rng, hd, n, 2.0);
            let kc = |c: usize| &k[c * hd..(c + 1) * hd];
            let vc = |c: usize| &v[c * hd..(c + 1) * hd];
            let mut got = vec![0f32; hd];
            attend_head_ref(&q, 0.125, 0..n, kc, vc, &mut got);
            let s: Vec<f64> = (0..n)
                .map(|c| {
                    kc(c)
                        .iter()
                        .zip(&q)
                        .map(|(&a, &b)| f16_to_f32(a) as f64 * b as f64)
                        .sum::<f64>()
                        * 0.125
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = w.iter().sum();
            for (d, g) in got.iter().enumerate() {
                let exact: f64 = (0..n)
                    .map(|c| w[c] * f16_to_f32(vc(c)[d]) as f64)
                    .sum::<f64>()
                    / z;
                worst = worst.max((*g as f64 - exact).abs());
            }
        }
    }
    eprintln!("f16-accumulator attention: max |err| {worst:.3e} (bound {F16_ACC_TOL:.0e})");
    assert!(worst < F16_ACC_TOL, "max |err| {worst}");
    // The f16 accumulator is visible: not the exact result to f32 precision.
    assert!(
        worst > 1e-5,
        "max |err| {worst}: f16 rounding of VKQ not applied?"
    );
}

/// The dot's lane order on a hand-made case: 32 products of 1 · 2^-12 accumulated per lane
/// are exact, so the sum is 32 · 2^-12; with one lane holding 1.0 the tiny terms of that lane
/// survive only in f32 lane arithmetic (1 + 2^-12 rounds to 1 in f16 but not in f32).
#[test]
fn dot_lane_order() {
    let one = f32_to_f16(1.0);
    let tiny = f32_to_f16(1.0 / 4096.0);
    let x = vec![tiny; 64];
    let y = vec![one; 64];
    assert_eq!(dot_ref(&x, &y), 64.0 / 4096.0);
    let mut x2 = x.clone();
    x2[0] = one;
    assert_eq!(dot_ref(&x2, &y), 1.0 + 63.0 / 4096.0);
}

#[test]
fn group_kernel_is_bit_identical_to_reference_per_head() {
    let mut rng = Rng::xorshift64_raw(0x2545_f491_4f6c_dd1d);
    let mut cases = 0;
    for hd in [64usize, 128, 40, 36, 8, 3] {
        for g in [1usize, 3, 7] {
            for n in [1usize, 2, 7, 64, 300] {
                let (q, k, v) = {
                    let (q0, k, v) = case(&mut rng, hd, n, 4.0);
                    let mut q = q0;
                    for _ in 1..g {
                        q.extend((0..hd).map(|_| rng.signed() * 4.0));
                    }
                    (q, k, v)
                };
                // Cells in a scrambled order (a window's runs need not be ascending).
                let cells: Vec<usize> = (0..n).map(|i| (i * 7 + 3) % n).collect();
                let kc = |c: usize| &k[c * hd..(c + 1) * hd];
                let vc = |c: usize| &v[c * hd..(c + 1) * hd];
                for isa in simd::available() {
                    let mut got = vec![f32::NAN; g * hd];
                    let cs = cells.iter().copied();
                    attend_group_on(isa, &q, hd, 0.125, cs, kc, vc, &mut got);
                    for (qh, gh) in q.chunks_exact(hd).zip(got.chunks_exact(hd)) {
                        let mut want = vec![0f32; hd];
                        attend_head_ref(qh, 0.125, cells.iter().copied(), kc, vc, &mut want);
                        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(gh), bits(&want), "{isa} hd {hd} group {g} n {n}");
                    }
                }
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 90);
}

/// `ops::attn::attention` over an f16 cache (the native numerics: the GQA-group kernel, each
/// group cut into parts of heads when (token, KV head) pairs are fewer than the threads) gives
/// every head the reference's bits, whatever the thread count: 1 and 3 tokens, groups of 7
/// and 1, threads 1 to 8 (with 2 KV heads and one token, 3 to 8 threads cut the groups).
#[test]
fn attention_heads_are_the_reference_on_any_thread_count() {
    use minfer_cpu::ops::attn::{attention, AttnParams};
    use minfer_gguf::GgmlType;
    let mut rng = Rng::xorshift64_raw(0x51ab);
    let (hd, n_cells) = (64usize, 70usize);
    let mut runs = 0;
    for (n_head, n_head_kv) in [(14usize, 2usize), (4, 4)] {
        let row = n_head_kv * hd;
        let kv = |rng: &mut Rng| -> Vec<u8> {
            (0..n_cells * row)
                .flat_map(|_| f32_to_f16(rng.signed() * 2.0).to_le_bytes())
                .collect()
        };
        let (k, v) = (kv(&mut rng), kv(&mut rng));
        let p = AttnParams {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale: 0.125,
            cache_type: GgmlType::F16,
            llamacpp: None,
        };
        for nt in [1usize, 3] {
            let q: Vec<f32> = (0..nt * n_head * hd).map(|_| rng.signed() * 2.0).collect();
            // Token t sees cells [t, 60 + 3 t).
            let window: Vec<f32> = (0..nt)
                .flat_map(|t| {
                    [
                        f32::from_bits(t as u32),
                        f32::from_bits((60 + 3 * t) as u32),
                    ]
                })
                .collect();
            let head = |b: &[u8], c: usize, g: usize| -> Vec<u16> {
                let at = (c * row + g * hd) * 2;
                b[at..at + 2 * hd]
                    .chunks_exact(2)
                    .map(|x| u16::from_le_bytes([x[0], x[1]]))
                    .collect()
            };
            let mut want = vec![0f32; nt * n_head * hd];
            for t in 0..nt {
                for h in 0..n_head {
                    let g = h / (n_head / n_head_kv);
                    let ks: Vec<Vec<u16>> = (0..n_cells).map(|c| head(&k, c, g)).collect();
                    let vs: Vec<Vec<u16>> = (0..n_cells).map(|c| head(&v, c, g)).collect();
                    let at = (t * n_head + h) * hd;
                    attend_head_ref(
                        &q[at..at + hd],
                        0.125,
                        t..60 + 3 * t,
                        |c| &ks[c],
                        |c| &vs[c],
                        &mut want[at..at + hd],
                    );
                }
            }
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for threads in 1..=8 {
                let mut got = vec![f32::NAN; want.len()];
                attention(&p, &q, &window, &k, &v, &mut got, threads).expect("attention");
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "heads {n_head}/{n_head_kv} tokens {nt} threads {threads}"
                );
                runs += 1;
            }
        }
    }
    assert_eq!(runs, 32);
}

/// The tiled kernel (`attend_tile_on`: several query rows of a GQA group over prefixes of one
/// list of cells) gives every head of every row the reference's bits on that head and its
/// prefix alone: head sizes with a tiled kernel (64, 128) and without (40), groups of 1, 2
/// and 7, tiles of 1 to 17 rows (the chains fill 16 lanes exactly, partly, and past one
/// vector), windows of 0 to 300 cells in a scrambled order, cut anywhere in a block, and
/// amplitudes whose score gaps pass 88 (the exponential's slow path).
#[test]
fn tile_kernel_is_bit_identical_to_reference_per_row_and_head() {
    let mut rng = Rng::xorshift64_raw(0x7117_e5ed);
    let n = 300usize;
    let mut cases = 0;
    for hd in [64usize, 128, 40] {
        for g in [1usize, 2, 7] {
            for rows in [1usize, 2, 5, 16, 17] {
                for amp in [1.0f32, 16.0] {
                    let q: Vec<Vec<f32>> = (0..rows)
                        .map(|_| (0..g * hd).map(|_| rng.signed() * amp).collect())
                        .collect();
                    let k: Vec<u16> = (0..hd * n)
                        .map(|_| f32_to_f16(rng.signed() * amp))
                        .collect();
                    let v: Vec<u16> = (0..hd * n).map(|_| f32_to_f16(rng.signed())).collect();
                    let cells: Vec<usize> = (0..n).map(|i| (i * 7 + 3) % n).collect();
                    // A prompt's rows (each one cell longer), then lengths anywhere, one empty.
                    let lens: Vec<usize> = (0..rows)
                        .map(|r| match r % 4 {
                            _ if r == 3 => 0,
                            0 | 1 => n - rows + r + 1,
                            _ => (rng.next_u64() % (n as u64 + 1)) as usize,
                        })
                        .collect();
                    let kc = |c: usize| &k[c * hd..(c + 1) * hd];
                    let vc = |c: usize| &v[c * hd..(c + 1) * hd];
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    for isa in simd::available() {
                        let mut got: Vec<Vec<f32>> = vec![vec![f32::NAN; g * hd]; rows];
                        let qs: Vec<&[f32]> = q.iter().map(|x| &x[..]).collect();
                        let mut outs: Vec<&mut [f32]> =
                            got.iter_mut().map(|x| &mut x[..]).collect();
                        attend_tile_on(isa, hd, 0.125, &qs, &lens, &cells, kc, vc, &mut outs);
                        for r in 0..rows {
                            for h in 0..g {
                                let mut want = vec![0f32; hd];
                                attend_head_ref(
                                    &q[r][h * hd..][..hd],
                                    0.125,
                                    cells[..lens[r]].iter().copied(),
                                    kc,
                                    vc,
                                    &mut want,
                                );
                                assert_eq!(
                                    bits(&got[r][h * hd..][..hd]),
                                    bits(&want),
                                    "{isa} hd {hd} group {g} rows {rows} row {r} head {h} \
                                     len {} amp {amp}",
                                    lens[r]
                                );
                            }
                        }
                    }
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 90);
}

/// `ops::attn::attention` over an f16 cache for a call of many rows (where the rows run by
/// tiles): every head of every row is the reference's over its window, whatever the thread
/// count and whatever else shares the call: two prompts' rows (spans from cells 0 and 100,
/// each row one cell longer), rows whose windows are no prefix of their neighbours', and
/// kv-map rows of two runs.
#[test]
fn prompt_rows_by_tiles_are_the_reference_on_any_thread_count() {
    use minfer_cpu::ops::attn::{attention, AttnParams, KV_MAP_RUNS};
    use minfer_gguf::GgmlType;
    let mut rng = Rng::xorshift64_raw(0x7a11);
    let (hd, n_cells, n_head, n_head_kv) = (64usize, 200usize, 14usize, 2usize);
    let row = n_head_kv * hd;
    let kv = |rng: &mut Rng| -> Vec<u8> {
        (0..n_cells * row)
            .flat_map(|_| f32_to_f16(rng.signed() * 2.0).to_le_bytes())
            .collect()
    };
    let (k, v) = (kv(&mut rng), kv(&mut rng));
    let p = AttnParams {
        n_head,
        n_head_kv,
        head_dim: hd,
        scale: 0.125,
        cache_type: GgmlType::F16,
        llamacpp: None,
    };
    // Windows as runs of (cell, len).
    let mut windows: Vec<Vec<(usize, usize)>> = Vec::new();
    windows.extend((0..37).map(|t| vec![(0, 20 + t)]));
    windows.extend((0..21).map(|t| vec![(100, 1 + t)]));
    windows.extend((0..5).map(|t| vec![(3 * t, 10 + t)]));
    windows.extend((0..19).map(|t| vec![(150, 10), (60, 1 + t)]));
    let nt = windows.len();
    let window: Vec<f32> = windows
        .iter()
        .flat_map(|w| {
            let mut m = vec![0u32; 2 * KV_MAP_RUNS];
            for (i, &(c, l)) in w.iter().enumerate() {
                m[2 * i] = c as u32;
                m[2 * i + 1] = l as u32;
            }
            m.into_iter().map(f32::from_bits)
        })
        .collect();
    let q: Vec<f32> = (0..nt * n_head * hd).map(|_| rng.signed() * 2.0).collect();
    let head = |b: &[u8], c: usize, g: usize| -> Vec<u16> {
        let at = (c * row + g * hd) * 2;
        b[at..at + 2 * hd]
            .chunks_exact(2)
            .map(|x| u16::from_le_bytes([x[0], x[1]]))
            .collect()
    };
    let mut want = vec![0f32; nt * n_head * hd];
    for (t, w) in windows.iter().enumerate() {
        let cells: Vec<usize> = w.iter().flat_map(|&(c, l)| c..c + l).collect();
        for h in 0..n_head {
            let g = h / (n_head / n_head_kv);
            let ks: Vec<Vec<u16>> = (0..n_cells).map(|c| head(&k, c, g)).collect();
            let vs: Vec<Vec<u16>> = (0..n_cells).map(|c| head(&v, c, g)).collect();
            let at = (t * n_head + h) * hd;
            attend_head_ref(
                &q[at..at + hd],
                0.125,
                cells.iter().copied(),
                |c| &ks[c],
                |c| &vs[c],
                &mut want[at..at + hd],
            );
        }
    }
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for threads in 1..=4 {
        let mut got = vec![f32::NAN; want.len()];
        attention(&p, &q, &window, &k, &v, &mut got, threads).expect("attention");
        for t in 0..nt {
            let at = t * n_head * hd;
            assert_eq!(
                bits(&got[at..][..n_head * hd]),
                bits(&want[at..][..n_head * hd]),
                "row {t} threads {threads}"
            );
        }
    }
}
