//! Q4_1, Q5_0 and Q8_0 weight rows against Q8_1 / Q8_0 activation rows, as ggml's x86
//! `ggml_vec_dot_*` (AVX2 code, also what AVX-512 builds run) and llamafile's tinyBLAS
//! (`tinyBLAS_Q0_AVX`, batches of two or more rows for Q5_0 and Q8_0) compute them.
//!
//! Per 32-element block: the 32 integer products are summed in eight i32 lanes (lane j holds
//! elements 4j..4j+3: maddubs + madd, or VNNI `dpbusd`, both exact); each lane becomes an f32
//! and `acc[j] = fma(d, lane, acc[j])` with `d = f16(w.d) * f16(a.d)` rounded to f32 first.
//! After the last block the eight lanes fold with [`hsum8`]. Q4_1 adds its min term apart:
//! `summs = fma(f16(w.m), f16(a.s), summs)` (GCC contracts ggml's `summs += m * s`), and the
//! result is `hsum8(acc) + summs`.

use super::hsum8;
use minfer_gguf::quants::f16_to_f32;

#[inline]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// One block's eight i32 lanes folded into the accumulator.
#[inline]
fn fma_lanes(acc: &mut [f32; 8], d: f32, w: &[i8; 32], a: &[u8]) {
    for (j, acc) in acc.iter_mut().enumerate() {
        let mut s = 0i32;
        for i in 4 * j..4 * j + 4 {
            s += w[i] as i32 * a[i] as i8 as i32;
        }
        *acc = d.mul_add(s as f32, *acc);
    }
}

/// Q8_0 (34-byte blocks: d, qs[32]) against Q8_0.
pub fn dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (wb, ab) in w.chunks_exact(34).zip(a.chunks_exact(34)) {
        let d = f16_at(wb, 0) * f16_at(ab, 0);
        let mut q = [0i8; 32];
        for (q, &b) in q.iter_mut().zip(&wb[2..34]) {
            *q = b as i8;
        }
        fma_lanes(&mut acc, d, &q, &ab[2..34]);
    }
    hsum8(&acc)
}

/// Q5_0 (22-byte blocks: d, qh u32, qs[16]) against Q8_0.
pub fn dot_q5_0(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (wb, ab) in w.chunks_exact(22).zip(a.chunks_exact(34)) {
        let d = f16_at(wb, 0) * f16_at(ab, 0);
        let qh = u32::from_le_bytes([wb[2], wb[3], wb[4], wb[5]]);
        let qs = &wb[6..22];
        let mut q = [0i8; 32];
        for i in 0..16 {
            let lo = (qs[i] & 0x0f) | (((qh >> i) & 1) << 4) as u8;
            let hi = (qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4) as u8;
            q[i] = lo as i8 - 16;
            q[i + 16] = hi as i8 - 16;
        }
        fma_lanes(&mut acc, d, &q, &ab[2..34]);
    }
    hsum8(&acc)
}

/// Q4_1 (20-byte blocks: d, m, qs[16]) against Q8_1 (36-byte blocks: d, s, qs[32]).
pub fn dot_q4_1(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (wb, ab) in w.chunks_exact(20).zip(a.chunks_exact(36)) {
        let d = f16_at(wb, 0) * f16_at(ab, 0);
        summs = f16_at(wb, 2).mul_add(f16_at(ab, 2), summs);
        let qs = &wb[4..20];
        let mut q = [0i8; 32];
        for i in 0..16 {
            q[i] = (qs[i] & 0x0f) as i8;
            q[i + 16] = (qs[i] >> 4) as i8;
        }
        fma_lanes(&mut acc, d, &q, &ab[4..36]);
    }
    hsum8(&acc) + summs
}
