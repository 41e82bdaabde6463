//! ggml's SIMD `expf` (`ggml_v_expf`, after ARM's optimized routine) and the SiLU / SwiGLU
//! built on it, lane by lane. Every lane is a pure function of its input (the vector code's
//! slow-path branches only blend per-lane results), so a scalar function per build is exact.
//! Elements past the last whole vector use ggml's scalar `x / (1 + expf(-x))` with the C
//! library's `expf`, which is what Rust's `f32::exp` calls on Linux.

use super::LlamaCppX86;

const SHIFT: f32 = 12_582_912.0; // 0x1.8p23: adding it rounds to an integer
const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b); // 0x1.715476p+0
const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 0x1.62e4p-1
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e); // 0x1.7f7d1cp-20
const C5: f32 = f32::from_bits(0x3c07_2010); // 0x1.0e4020p-7
const C4: f32 = f32::from_bits(0x3d2b_9f17); // 0x1.573e2ep-5
const C3: f32 = f32::from_bits(0x3e2a_af33); // 0x1.555e66p-3
const C2: f32 = f32::from_bits(0x3eff_fedb); // 0x1.fffdb6p-2
const C1: f32 = f32::from_bits(0x3f7f_fff6); // 0x1.ffffecp-1

/// One lane of `ggml_v_expf` as the given build computes it.
#[inline]
pub fn v_expf(simd: LlamaCppX86, x: f32) -> f32 {
    let z = x.mul_add(LOG2E, SHIFT);
    let n = z - SHIFT;
    let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let u = b * b;
    let poly = C5.mul_add(b, C4).mul_add(u, C3.mul_add(b, C2));
    match simd {
        LlamaCppX86::Avx512 => {
            let j = poly.mul_add(u, C1.mul_add(b, 1.0));
            if n.abs() > 192.0 {
                // ggml blends +inf for n > 0 and 0 for n <= 0.
                return if n <= 0.0 { 0.0 } else { f32::INFINITY };
            }
            scalef(j, n)
        }
        LlamaCppX86::Avx2 => {
            let j = poly.mul_add(u, C1 * b);
            let e = z.to_bits().wrapping_shl(23);
            let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
            let a = n.abs();
            if a > 192.0 {
                let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
                let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
                s1 * s1
            } else if a > 126.0 {
                let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
                let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
                let s2 = f32::from_bits(e.wrapping_sub(g));
                s2.mul_add(j, s2) * s1
            } else {
                k.mul_add(j, k)
            }
        }
    }
}

/// AVX-512's `vscalefps` for an integral `n` with |n| <= 192: j * 2^n rounded once to f32
/// (exact in f64, then one correctly rounded conversion, subnormals included).
#[inline]
fn scalef(j: f32, n: f32) -> f32 {
    (j as f64 * 2f64.powi(n as i32)) as f32
}

/// Vector width of the build's SiLU loops.
fn lanes(simd: LlamaCppX86) -> usize {
    match simd {
        LlamaCppX86::Avx2 => 8,
        LlamaCppX86::Avx512 => 16,
    }
}

/// `ggml_v_silu`: x / (1 + expf(0 - x)).
#[inline]
fn v_silu(simd: LlamaCppX86, x: f32) -> f32 {
    x / (1.0 + v_expf(simd, 0.0 - x))
}

/// ggml's scalar `ggml_silu_f32`.
#[inline]
fn silu_scalar(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `ggml_vec_silu_f32` over `x`.
pub fn silu(simd: LlamaCppX86, x: &[f32], out: &mut [f32]) {
    let whole = x.len() / lanes(simd) * lanes(simd);
    for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        *o = if i < whole {
            v_silu(simd, v)
        } else {
            silu_scalar(v)
        };
    }
}

/// `ggml_vec_swiglu_f32`: silu(gate) * up, row by row (`row` elements each, as ggml calls it
/// once per row, so the scalar tail is per row).
pub fn swiglu(simd: LlamaCppX86, gate: &[f32], up: &[f32], row: usize, out: &mut [f32]) {
    let row = row.max(1);
    let whole = row / lanes(simd) * lanes(simd);
    for ((o, g), u) in out
        .chunks_mut(row)
        .zip(gate.chunks(row))
        .zip(up.chunks(row))
    {
        for (i, ((o, &g), &u)) in o.iter_mut().zip(g).zip(u).enumerate() {
            *o = if i < whole {
                v_silu(simd, g) * u
            } else {
                silu_scalar(g) * u
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_the_hex_floats() {
        assert_eq!(LOG2E, std::f32::consts::LOG2_E);
        assert_eq!(LN2_HI, 0.693_145_75_f32);
        assert_eq!(C1, 0.999_999_4_f32);
        assert_eq!(SHIFT, 1.5 * 8_388_608.0);
    }

    /// Both forms stay within ggml's stated 1.5 ulp of the true exp over the range SiLU sees,
    /// and differ from each other somewhere (control: they are not the same function).
    #[test]
    fn expf_forms_are_close_to_exp_and_distinct() {
        let mut differ = 0;
        let mut x = -80.0f32;
        while x < 80.0 {
            let t = (x as f64).exp();
            for simd in [LlamaCppX86::Avx2, LlamaCppX86::Avx512] {
                let r = v_expf(simd, x) as f64;
                let ulp = (t as f32).abs() as f64 * f32::EPSILON as f64;
                assert!(
                    (r - t).abs() <= 2.0 * ulp,
                    "{simd:?} exp({x}) = {r}, want {t}"
                );
            }
            if v_expf(LlamaCppX86::Avx2, x) != v_expf(LlamaCppX86::Avx512, x) {
                differ += 1;
            }
            x += 0.013;
        }
        assert!(differ > 0);
        assert_eq!(v_expf(LlamaCppX86::Avx512, -200.0), 0.0);
        assert_eq!(v_expf(LlamaCppX86::Avx512, 200.0), f32::INFINITY);
        assert_eq!(v_expf(LlamaCppX86::Avx2, -200.0), 0.0);
        assert_eq!(v_expf(LlamaCppX86::Avx2, 200.0), f32::INFINITY);
    }
}
