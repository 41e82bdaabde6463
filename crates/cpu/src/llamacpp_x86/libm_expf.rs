//! The C library's `expf` (glibc's, in the build its FMA machines run: `__expf_fma`) eight
//! lanes at a time, so that a kernel whose reference calls `f32::exp` (which calls that
//! `expf` on Linux) can take several exponentials per instruction and keep its registers
//! (a call clobbers every vector register). Bit for bit the scalar function on every input
//! (`tests/libm_expf.rs`; all 2^32 floats compared once by hand).
//!
//! The algorithm (glibc since 2.27, from Arm's optimized routines; the constants below are its
//! `__exp2f_data`, read from libm 2.36): with N = 32, x = (k + r) ln2 / N, |r| <= 1/2,
//! exp(x) = 2^(k/N) 2^(r/N), the first factor from a 32-entry table with k's high bits added
//! to the exponent, the second a cubic in r; all in f64 and rounded to f32 once. The FMA
//! build fuses: kd = fma(InvLn2N, x, Shift) (rounding k to an integer), r = fma(InvLn2N, x,
//! -(kd - Shift)), p = fma(r, C0, C1), y = fma(r, C2, 1), y = fma(p, r r, y), y s. Inputs
//! with |x| >= 88 take the scalar slow path's branches: -inf gives 0, NaN and +inf x + x,
//! x > 0x1.62e42ep6 +inf, x < -0x1.9fe368p6 0, x < -0x1.9d1d9ep6 0x1p-149 (its
//! `__math_may_uflowf` value), the rest the formula.

use std::arch::x86_64::*;

/// 2^(i/32) as bits, minus i << 47 (`__exp2f_data.tab`).
const TAB: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// 32 / ln 2 (`invln2_scaled`).
const INV_LN2_N: f64 = f64::from_bits(0x40471547652b82fe);
/// 0x1.8p52: adding it rounds to an integer (`shift`).
const SHIFT: f64 = f64::from_bits(0x4338000000000000);
/// `poly_scaled`.
const C0: f64 = f64::from_bits(0x3ebc6af84b912394);
const C1: f64 = f64::from_bits(0x3f2ebfce50fac4f3);
const C2: f64 = f64::from_bits(0x3f962e42ff0c52d6);
/// The slow path's thresholds (`top12` of 88.0 and the over/underflow bounds).
const TOP12_88: i32 = 0x42a;
const OVERFLOW: f32 = f32::from_bits(0x42b17217); // 0x1.62e42ep6
const UNDERFLOW: f32 = f32::from_bits(0xc2cff1b4); // -0x1.9fe368p6
const MAY_UNDERFLOW: f32 = f32::from_bits(0xc2ce8ecf); // -0x1.9d1d9ep6

/// `expf` of each lane of `x` (see the module docs).
#[inline]
#[target_feature(enable = "avx512f,avx512vl,fma")]
pub(crate) fn expf8(x: __m256) -> __m256 {
    let xd = _mm512_cvtps_pd(x);
    let inv = _mm512_set1_pd(INV_LN2_N);
    let shift = _mm512_set1_pd(SHIFT);
    let z = _mm512_fmadd_pd(inv, xd, shift);
    let ki = _mm512_castpd_si512(z);
    let kd = _mm512_sub_pd(z, shift);
    let r = _mm512_fmsub_pd(inv, xd, kd);
    // SAFETY: TAB is 32 u64; unaligned loads.
    let (t0, t1, t2, t3) = unsafe {
        let p = TAB.as_ptr().cast::<__m512i>();
        (
            _mm512_loadu_si512(p),
            _mm512_loadu_si512(p.add(1)),
            _mm512_loadu_si512(p.add(2)),
            _mm512_loadu_si512(p.add(3)),
        )
    };
    // Entries 0-15 and 16-31 by the index's low 4 bits, then bit 4 picks.
    let lo = _mm512_permutex2var_epi64(t0, ki, t1);
    let hi = _mm512_permutex2var_epi64(t2, ki, t3);
    let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
    let t = _mm512_mask_blend_epi64(upper, lo, hi);
    let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
    let p = _mm512_fmadd_pd(r, _mm512_set1_pd(C0), _mm512_set1_pd(C1));
    let r2 = _mm512_mul_pd(r, r);
    let y = _mm512_fmadd_pd(r, _mm512_set1_pd(C2), _mm512_set1_pd(1.0));
    let y = _mm512_fmadd_pd(p, r2, y);
    let fast = _mm512_cvtpd_ps(_mm512_mul_pd(y, s));
    // The slow path's lanes: |x| >= 88 (top12 past 0x42a), rare; blended in.
    let bits = _mm256_castps_si256(x);
    let top = _mm256_and_si256(_mm256_srli_epi32::<20>(bits), _mm256_set1_epi32(0x7ff));
    let slow = _mm256_cmpgt_epi32_mask(top, _mm256_set1_epi32(TOP12_88));
    if slow == 0 {
        return fast;
    }
    let mut out = [0f32; 8];
    let mut xs = [0f32; 8];
    // SAFETY: 8 writable f32 each.
    unsafe {
        _mm256_storeu_ps(out.as_mut_ptr(), fast);
        _mm256_storeu_ps(xs.as_mut_ptr(), x);
    }
    for (o, &x) in out.iter_mut().zip(&xs) {
        *o = slow_path(x).unwrap_or(*o);
    }
    // SAFETY: 8 readable f32.
    unsafe { _mm256_loadu_ps(out.as_ptr()) }
}

/// [`expf8`] in AVX2 and FMA alone (for kernels that must not use AVX-512): the same
/// operations in two vectors of four f64 lanes, the table read by a gather.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn expf8_avx2(x: __m256) -> __m256 {
    let lo = expf4d(_mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    let hi = expf4d(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)));
    let fast = _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
    let bits = _mm256_castps_si256(x);
    let top = _mm256_and_si256(_mm256_srli_epi32::<20>(bits), _mm256_set1_epi32(0x7ff));
    let slow = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(
        top,
        _mm256_set1_epi32(TOP12_88),
    )));
    if slow == 0 {
        return fast;
    }
    let mut out = [0f32; 8];
    let mut xs = [0f32; 8];
    // SAFETY: 8 writable f32 each.
    unsafe {
        _mm256_storeu_ps(out.as_mut_ptr(), fast);
        _mm256_storeu_ps(xs.as_mut_ptr(), x);
    }
    for (o, &x) in out.iter_mut().zip(&xs) {
        *o = slow_path(x).unwrap_or(*o);
    }
    // SAFETY: 8 readable f32.
    unsafe { _mm256_loadu_ps(out.as_ptr()) }
}

/// The slow path's value for `x` where it differs from the formula (see [`expf8`]).
#[inline]
fn slow_path(x: f32) -> Option<f32> {
    if x == f32::NEG_INFINITY {
        Some(0.0)
    } else if x.is_nan() || x == f32::INFINITY {
        Some(x + x)
    } else if x > OVERFLOW {
        Some(f32::INFINITY)
    } else if x < UNDERFLOW {
        Some(0.0)
    } else if x < MAY_UNDERFLOW {
        Some(f32::from_bits(1))
    } else {
        None
    }
}

/// The formula of [`expf8`] on four f64 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn expf4d(xd: __m256d) -> __m256d {
    let inv = _mm256_set1_pd(INV_LN2_N);
    let shift = _mm256_set1_pd(SHIFT);
    let z = _mm256_fmadd_pd(inv, xd, shift);
    let ki = _mm256_castpd_si256(z);
    let kd = _mm256_sub_pd(z, shift);
    let r = _mm256_fmsub_pd(inv, xd, kd);
    let idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    // SAFETY: every index is in 0..32, TAB's length.
    let t = unsafe { _mm256_i64gather_epi64::<8>(TAB.as_ptr().cast(), idx) };
    let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
    let p = _mm256_fmadd_pd(r, _mm256_set1_pd(C0), _mm256_set1_pd(C1));
    let r2 = _mm256_mul_pd(r, r);
    let y = _mm256_fmadd_pd(r, _mm256_set1_pd(C2), _mm256_set1_pd(1.0));
    let y = _mm256_fmadd_pd(p, r2, y);
    _mm256_mul_pd(y, s)
}

/// Whether [`expf8_avx2`] gives the C library's bits on [`matches_c_library`]'s probes.
pub(crate) fn avx2_matches_c_library() -> bool {
    static SAME: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SAME.get_or_init(|| {
        let mut x: Vec<f32> = (0..4096).map(|i| -(i as f32) * 0.0271).collect();
        x.extend([
            f32::NEG_INFINITY,
            -103.5,
            -103.3,
            -104.0,
            -88.5,
            -0.0,
            0.5,
            1e-8,
            -1e-30,
        ]);
        x.resize(x.len().next_multiple_of(8), -1.0);
        let mut got = vec![0f32; x.len()];
        expf_lanes_avx2(&x, &mut got).is_some()
            && x.iter()
                .zip(&got)
                .all(|(a, g)| a.exp().to_bits() == g.to_bits())
    })
}

/// [`expf8_avx2`] over `x` (a multiple of 8 long) into `out`, for tests. None where this
/// CPU lacks AVX2 or FMA.
pub fn expf_lanes_avx2(x: &[f32], out: &mut [f32]) -> Option<()> {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        return None;
    }
    assert!(x.len() == out.len() && x.len().is_multiple_of(8));
    for (xc, oc) in x.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
        // SAFETY: features checked above; 8 f32 each.
        unsafe {
            let v = expf8_avx2(_mm256_loadu_ps(xc.as_ptr()));
            _mm256_storeu_ps(oc.as_mut_ptr(), v);
        }
    }
    Some(())
}

/// Whether [`expf8`] gives this process's C library `expf` bits on a set of probes (checked
/// once): where the C library is not glibc's FMA build, the kernels keep calling `f32::exp`
/// rather than give other bits than their reference.
pub(crate) fn matches_c_library() -> bool {
    static SAME: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SAME.get_or_init(|| {
        // Steps through the table's entries and exponents, the slow path's thresholds.
        let mut x: Vec<f32> = (0..4096).map(|i| -(i as f32) * 0.0271).collect();
        x.extend([
            f32::NEG_INFINITY,
            -103.5,
            -103.3,
            -104.0,
            -88.5,
            -0.0,
            0.5,
            1e-8,
            -1e-30,
        ]);
        x.resize(x.len().next_multiple_of(8), -1.0);
        let mut got = vec![0f32; x.len()];
        expf_lanes(&x, &mut got).is_some()
            && x.iter()
                .zip(&got)
                .all(|(a, g)| a.exp().to_bits() == g.to_bits())
    })
}

/// [`expf8`] over `x` (a multiple of 8 long) into `out`, for tests. None where this CPU
/// lacks AVX-512 (F, VL) or FMA.
pub fn expf_lanes(x: &[f32], out: &mut [f32]) -> Option<()> {
    if !(is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("fma"))
    {
        return None;
    }
    assert!(x.len() == out.len() && x.len().is_multiple_of(8));
    for (xc, oc) in x.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
        // SAFETY: features checked above; 8 f32 each.
        unsafe {
            let v = expf8(_mm256_loadu_ps(xc.as_ptr()));
            _mm256_storeu_ps(oc.as_mut_ptr(), v);
        }
    }
    Some(())
}

/// `out[i] = silu(gate[i]) · up[i]` as `ops::elementwise::swiglu` computes it (g / (1 +
/// expf(-g)), then · u: each step an f32 operation rounded on its own, the exponential the C
/// library's), eight lanes at a time with the exponentials by [`expf8`] (`isa` AVX-512) or
/// [`expf8_avx2`] (`isa` AVX2), the last `len % 8` one at a time by the scalar function: so
/// the bits of the scalar loop. Returns false, having written nothing, where neither form
/// runs here or gives the C library's bits on its probes (the caller then runs the scalar
/// loop). Panics unless the three slices have the same length.
pub fn swiglu_lanes(isa: crate::simd::Isa, gate: &[f32], up: &[f32], out: &mut [f32]) -> bool {
    assert!(gate.len() == out.len() && up.len() == out.len());
    let fma = is_x86_feature_detected!("fma");
    match isa {
        crate::simd::Isa::Avx512Vnni if fma && matches_c_library() => {
            // SAFETY: AVX-512 F/VL (the instruction set in use) and FMA confirmed above.
            unsafe { swiglu_avx512(gate, up, out) }
        }
        crate::simd::Isa::Avx2 if fma && avx2_matches_c_library() => {
            // SAFETY: AVX2 (the instruction set in use) and FMA confirmed above.
            unsafe { swiglu_avx2(gate, up, out) }
        }
        _ => return false,
    }
    true
}

/// The lanes of [`swiglu_lanes`] given their exponential `$exp`, under `$feat`.
macro_rules! swiglu_body {
    ($name:ident, $exp:ident, $feat:literal) => {
        /// [`swiglu_lanes`]' loop.
        ///
        /// # Safety
        /// The CPU must have the features enabled here; the slices have one length.
        #[target_feature(enable = $feat)]
        unsafe fn $name(gate: &[f32], up: &[f32], out: &mut [f32]) {
            let n8 = out.len() / 8 * 8;
            let one = _mm256_set1_ps(1.0);
            let sign = _mm256_set1_ps(-0.0);
            for i in (0..n8).step_by(8) {
                // SAFETY: i + 8 <= n8, within each slice.
                unsafe {
                    let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                    let u = _mm256_loadu_ps(up.as_ptr().add(i));
                    // -g flips the sign bit, as the scalar negation does.
                    let e = $exp(_mm256_xor_ps(g, sign));
                    let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
                    _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(s, u));
                }
            }
            for i in n8..out.len() {
                out[i] = crate::ops::elementwise::silu(gate[i]) * up[i];
            }
        }
    };
}

swiglu_body!(swiglu_avx512, expf8, "avx512f,avx512vl,fma");
swiglu_body!(swiglu_avx2, expf8_avx2, "avx2,fma");
