//! Gate for `llamacpp_x86::libm_expf::expf_lanes` (glibc's `expf`, eight lanes at a time):
//! bit-identical to the C library's `expf` (`f32::exp`) on a quarter of the floats with the
//! sign bit set, every one in [-105, -87] and a 64th of the others (NaNs compared as NaN;
//! all 2^32 floats checked once by hand, 2026-12-07: equal, 24 s). Skips, saying so, on a CPU without AVX-512 (F, VL) and FMA,
//! and where the C library is not glibc's FMA build (the function it copies): then the first
//! probe differs and the test reports which.
//!
//! Control (tried by hand): the table's entry 1 with bit 11 flipped (2^-41 relative) fails
//! it; its last bit flipped passes (every f64 result still rounds to the same f32).
#![cfg(target_arch = "x86_64")]

use minfer_cpu::llamacpp_x86::libm_expf::{expf_lanes, expf_lanes_avx2};

/// Every float from `first` in steps of `step`, in chunks, against the C library.
fn sweep(first: u64, step: u64, end: u64) -> u64 {
    sweep_with(expf_lanes, first, step, end)
}

/// [`sweep`] of the lanes function `lanes`.
fn sweep_with(lanes: fn(&[f32], &mut [f32]) -> Option<()>, first: u64, step: u64, end: u64) -> u64 {
    const CHUNK: usize = 1 << 16;
    let (mut x, mut got) = (vec![0f32; CHUNK], vec![0f32; CHUNK]);
    let mut checked = 0;
    let mut next = first;
    while next < end {
        let n = (((end - next).div_ceil(step)) as usize).min(CHUNK) & !7;
        let n = if n == 0 { 8 } else { n };
        for (i, v) in x[..n].iter_mut().enumerate() {
            *v = f32::from_bits((next + i as u64 * step).min(end - 1) as u32);
        }
        lanes(&x[..n], &mut got[..n]).expect("checked by the caller");
        for (&xi, &g) in x[..n].iter().zip(&got[..n]) {
            let want = xi.exp();
            let same = g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan());
            assert!(
                same,
                "expf({xi:e} = {:#010x}): lanes {g:e} ({:#010x}), C library {want:e} ({:#010x})",
                xi.to_bits(),
                g.to_bits(),
                want.to_bits()
            );
        }
        checked += n as u64;
        next += n as u64 * step;
    }
    checked
}

/// Every fourth float with the sign bit set (the kernels' arguments are <= 0, -inf
/// included), every one of them in [-105, -87] (the slow path's thresholds) and every 64th
/// of the others, on two threads (CI time: all of them took 24 s).
#[test]
fn lanes_are_the_c_librarys_expf_on_negative_floats() {
    let (mut x, mut got) = ([0f32; 8], [0f32; 8]);
    x[1] = -1.0;
    if expf_lanes(&x, &mut got).is_none() {
        eprintln!("SKIP: no AVX-512 F/VL + FMA on this CPU");
        return;
    }
    let half = 1u64 << 31;
    let (minus_87, minus_105) = ((-87f32).to_bits() as u64, (-105f32).to_bits() as u64);
    let counts = std::thread::scope(|s| {
        let a = s.spawn(|| sweep(half, 4, 2 * half));
        let b = s.spawn(|| sweep(minus_87, 1, minus_105 + 1) + sweep(0, 64, half));
        (a.join().expect("thread"), b.join().expect("thread"))
    });
    assert!(counts.0 >= half / 4 && counts.1 >= half / 64, "{counts:?}");
}

/// The AVX2 form (`expf_lanes_avx2`, kernels that must not use AVX-512): every 16th float
/// with the sign bit set, every one in [-105, -87], every 256th of the others.
#[test]
fn avx2_lanes_are_the_c_librarys_expf() {
    let (x, mut got) = ([-1f32; 8], [0f32; 8]);
    if expf_lanes_avx2(&x, &mut got).is_none() {
        eprintln!("SKIP: no AVX2 + FMA on this CPU");
        return;
    }
    let half = 1u64 << 31;
    let (minus_87, minus_105) = ((-87f32).to_bits() as u64, (-105f32).to_bits() as u64);
    let n = sweep_with(expf_lanes_avx2, half, 16, 2 * half)
        + sweep_with(expf_lanes_avx2, minus_87, 1, minus_105 + 1)
        + sweep_with(expf_lanes_avx2, 0, 256, half);
    assert!(n >= half / 16, "{n}");
}

/// `swiglu_lanes` (the FFN's silu(gate) · up, eight lanes at a time with the exponentials
/// above) and `ops::elementwise::swiglu_threads` give the scalar loop's bits
/// (`ops::elementwise::swiglu`), on each instruction set here: gates every 997th float
/// (infinities, NaNs, subnormals, both signs; past ±88 the exponential's slow path) and
/// random ones, ups of every kind, lengths not a multiple of 8 (the last lanes scalar).
/// Controls (2026-12-07, by hand, each taken out again): the lanes computing g · (1 / (1 +
/// e)) instead of g / (1 + e) failed it (on AVX2, the first checked); their exponential of g
/// instead of -g too.
#[test]
fn swiglu_lanes_are_the_scalar_loop() {
    use minfer_cpu::llamacpp_x86::libm_expf::swiglu_lanes;
    use minfer_cpu::ops::elementwise::{swiglu, swiglu_threads};
    use minfer_cpu::simd::{self, Isa};
    let mut gate: Vec<f32> = (0..(1u64 << 32))
        .step_by(997)
        .map(|b| f32::from_bits(b as u32))
        .collect();
    gate.extend((0..40_000).map(|i| ((i * 7919 % 20011) as f32 - 10005.0) * 0.003));
    let n = gate.len() - 3;
    let gate = &gate[..n];
    let kinds = [1.5, -0.0, 0.0, f32::INFINITY, f32::NAN, 3e-39, -7.25];
    let up: Vec<f32> = (0..n)
        .map(|i| {
            if i % 11 == 0 {
                kinds[i / 11 % kinds.len()]
            } else {
                ((i * 104_729 % 4099) as f32 - 2049.0) * 0.01
            }
        })
        .collect();
    let mut want = vec![0f32; n];
    swiglu(gate, &up, &mut want);
    let bits = |v: &[f32]| -> Vec<u32> { v.iter().map(|x| x.to_bits()).collect() };
    let mut ran = 0;
    for isa in [Isa::Avx2, Isa::Avx512Vnni] {
        if !simd::available().contains(&isa) {
            continue;
        }
        for len in [n, 8, 13, 7] {
            let mut got = vec![f32::NAN; len];
            if !swiglu_lanes(isa, &gate[..len], &up[..len], &mut got) {
                eprintln!("SKIP {isa}: no FMA, or not glibc's expf");
                continue;
            }
            assert!(bits(&got) == bits(&want[..len]), "{isa}, {len} elements");
            ran += 1;
        }
    }
    for threads in [1, 2, 3] {
        let mut got = vec![f32::NAN; n];
        swiglu_threads(gate, &up, &mut got, threads);
        assert!(
            bits(&got) == bits(&want),
            "swiglu_threads, {threads} threads"
        );
    }
    eprintln!("{ran} lane runs");
}
