//! Q6_K weight rows against Q8_K activations as ggml's x86 `ggml_vec_dot_q6_K_q8_K` (AVX2
//! code, also run by AVX-512 builds) computes them.
//!
//! Per 256-element super-block, eight i32 lanes: lane j sums, over the eight 32-byte chunks
//! (two halves of 128 elements, four chunks each), the bytes 4j..4j+3 of each chunk as
//! q6 · q8 · scale (q6 unsigned 0..63, the scale of the element's 16-group), minus
//! 32 · (bsums[2j] · scale[2j] + bsums[2j+1] · scale[2j+1]) (the -32 offset, taken from the
//! activation's 16-element sums; a different lane split than the products, still exact).
//! Then `acc[j] = fma(d, f32(lane), acc[j])` with `d = a.d * f16(w.d)`; [`hsum8`] at the end.

use super::hsum8;
use minfer_gguf::quants::f16_to_f32;

const W_BYTES: usize = 210;
const A_BYTES: usize = 292;

/// Q6_K (ql[128], qh[64], scales i8[16], d f16) against Q8_K (d f32, qs[256], bsums i16[16]).
pub fn dot_q6_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (wb, ab) in w.chunks_exact(W_BYTES).zip(a.chunks_exact(A_BYTES)) {
        let (ql, qh) = (&wb[0..128], &wb[128..192]);
        let sc = |i: usize| wb[192 + i] as i8 as i32;
        let wd = f16_to_f32(u16::from_le_bytes([wb[208], wb[209]]));
        let ad = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
        let q8 = |i: usize| ab[4 + i] as i8 as i32;
        let bsum = |i: usize| i16::from_le_bytes([ab[260 + 2 * i], ab[261 + 2 * i]]) as i32;
        let d = ad * wd;
        let mut lanes = [0i32; 8];
        for half in 0..2 {
            let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
            for l in 0..32 {
                let h = qh[l] as i32;
                let q = [
                    (ql[l] & 0x0f) as i32 | (h & 3) << 4,
                    (ql[l + 32] & 0x0f) as i32 | ((h >> 2) & 3) << 4,
                    (ql[l] >> 4) as i32 | ((h >> 4) & 3) << 4,
                    (ql[l + 32] >> 4) as i32 | ((h >> 6) & 3) << 4,
                ];
                for (c, q) in q.into_iter().enumerate() {
                    let e = 128 * half + 32 * c + l;
                    lanes[l / 4] += q * q8(e) * sc(e / 16);
                }
            }
        }
        for (j, lane) in lanes.iter_mut().enumerate() {
            *lane -= 32 * (bsum(2 * j) * sc(2 * j) + bsum(2 * j + 1) * sc(2 * j + 1));
        }
        for (acc, &lane) in acc.iter_mut().zip(&lanes) {
            *acc = d.mul_add(lane as f32, *acc);
        }
    }
    hsum8(&acc)
}
