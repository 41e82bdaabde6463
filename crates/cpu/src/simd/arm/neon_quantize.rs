//! NEON activation quantization to Q8_0, Q8_1 and Q8_K, byte-identical to
//! `minfer_gguf::quants::quantize_act_row` (llama.cpp's x86 rule, so both ISAs encode the same
//! bytes). `vcvtnq_s32_f32` rounds half to even (every type) with the multiplier 127 / max|x|
//! for Q8_0/Q8_1; it saturates and sends NaN to 0, and the saturating narrows finish Rust's
//! saturating `as i8`. `vmaxnmq_f32` skips NaN like the reference's `f32::max`.

use std::arch::aarch64::*;

use minfer_gguf::quants::f32_to_f16;

#[inline]
#[target_feature(enable = "neon")]
fn load4(x: &[f32], i: usize) -> float32x4_t {
    let x = &x[i..i + 4];
    // SAFETY: `x` has 4 readable f32; vld1q has no alignment requirement.
    unsafe { vld1q_f32(x.as_ptr()) }
}

/// max |x| over `x` (a multiple of 4 elements), NaN skipped.
#[inline]
#[target_feature(enable = "neon")]
fn abs_max(x: &[f32]) -> f32 {
    let mut acc = vdupq_n_f32(0.0);
    for i in (0..x.len()).step_by(4) {
        acc = vmaxnmq_f32(acc, vabsq_f32(load4(x, i)));
    }
    vmaxnmvq_f32(acc)
}

/// 16 i32 (four vectors) narrowed with saturation to 16 i8, stored at `out`.
#[inline]
#[target_feature(enable = "neon")]
fn narrow_store(v: [int32x4_t; 4], out: &mut [u8]) -> int8x16_t {
    let lo = vcombine_s16(vqmovn_s32(v[0]), vqmovn_s32(v[1]));
    let hi = vcombine_s16(vqmovn_s32(v[2]), vqmovn_s32(v[3]));
    let q = vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi));
    let out = &mut out[..16];
    // SAFETY: `out` has 16 writable bytes; vst1q has no alignment requirement.
    unsafe { vst1q_s8(out.as_mut_ptr().cast(), q) };
    q
}

/// The Q8_0 rule for one 32-element block: writes qs, returns (d, Σq).
#[inline]
#[target_feature(enable = "neon")]
fn quant_8bit(x: &[f32], qs: &mut [u8]) -> (f32, i32) {
    let amax = abs_max(&x[..32]);
    let d = amax / 127.0;
    let id = if amax == 0.0 { 0.0 } else { 127.0 / amax };
    let mut sum = 0i32;
    for h in 0..2 {
        let v: [int32x4_t; 4] =
            std::array::from_fn(|k| vcvtnq_s32_f32(vmulq_n_f32(load4(x, 16 * h + 4 * k), id)));
        let q = narrow_store(v, &mut qs[16 * h..]);
        sum += vaddlvq_s8(q) as i32;
    }
    (d, sum)
}

#[target_feature(enable = "neon")]
pub(super) fn quant_q8_0(x: &[f32], out: &mut [u8]) {
    for (x, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        let (d, _) = quant_8bit(x, &mut b[2..34]);
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    }
}

#[target_feature(enable = "neon")]
pub(super) fn quant_q8_1(x: &[f32], out: &mut [u8]) {
    for (x, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(36)) {
        let (d, sum) = quant_8bit(x, &mut b[4..36]);
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        b[2..4].copy_from_slice(&f32_to_f16(sum as f32 * d).to_le_bytes());
    }
}

#[target_feature(enable = "neon")]
pub(super) fn quant_q8_k(x: &[f32], out: &mut [u8]) {
    for (x, b) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
        b.fill(0);
        let amax = abs_max(x);
        if amax == 0.0 {
            continue;
        }
        // The first element of largest magnitude decides the sign of the scale.
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        // |iscale · x| <= 127·(1 + 2^-24)^2 < 127.5, so every q is in -127..=127 (NaN → 0)
        // and the reference's `.min(127)` never bites.
        for c in 0..16 {
            let v: [int32x4_t; 4] = std::array::from_fn(|k| {
                vcvtnq_s32_f32(vmulq_n_f32(load4(x, 16 * c + 4 * k), iscale))
            });
            let q = narrow_store(v, &mut b[4 + 16 * c..]);
            let s = vaddlvq_s8(q);
            b[260 + 2 * c..262 + 2 * c].copy_from_slice(&s.to_le_bytes());
        }
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}
