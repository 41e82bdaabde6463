//! The dot-product dispatch point: one function per weight type, chosen once per matmul.
//! The demo models' types use the portable kernels of [`crate::fastdot`] (bit-identical to
//! the reference, `tests/fastdot.rs`); every other type uses the scalar reference of
//! `minfer_gguf::quants`. SIMD variants slot in here per type, proven the same way.

use crate::fastdot;
use minfer_gguf::{quants, GgmlType};

/// `dot(n, weight_row, activation_row)`; the activation row is encoded in
/// `quants::vec_dot_type(ty)`.
pub type DotFn = fn(GgmlType, usize, &[u8], &[u8]) -> minfer_gguf::Result<f32>;

pub fn select(ty: GgmlType) -> DotFn {
    match ty {
        GgmlType::F32 => dot_f32,
        GgmlType::Q8_0 => |_, n, w, a| Ok(fastdot::q8_0(n, w, a)),
        GgmlType::Q4_1 => |_, n, w, a| Ok(fastdot::q4_1(n, w, a)),
        GgmlType::Q5_0 => |_, n, w, a| Ok(fastdot::q5_0(n, w, a)),
        GgmlType::Q4K => |_, n, w, a| Ok(fastdot::q4_k(n, w, a)),
        GgmlType::Q6K => |_, n, w, a| Ok(fastdot::q6_k(n, w, a)),
        _ => quants::vec_dot,
    }
}

/// f32 weights · f32 activations, accumulated in f32 lanes of 8.
fn dot_f32(_ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> minfer_gguf::Result<f32> {
    let mut acc = [0f32; 8];
    let (wc, ac) = (&w[..n * 4], &a[..n * 4]);
    for (wb, ab) in wc.chunks_exact(32).zip(ac.chunks_exact(32)) {
        for (k, lane) in acc.iter_mut().enumerate() {
            let o = k * 4;
            *lane += f32::from_le_bytes([wb[o], wb[o + 1], wb[o + 2], wb[o + 3]])
                * f32::from_le_bytes([ab[o], ab[o + 1], ab[o + 2], ab[o + 3]]);
        }
    }
    let mut s: f32 = acc.iter().sum();
    let done = n / 8 * 8;
    for i in done..n {
        let o = i * 4;
        s += f32::from_le_bytes([w[o], w[o + 1], w[o + 2], w[o + 3]])
            * f32::from_le_bytes([a[o], a[o + 1], a[o + 2], a[o + 3]]);
    }
    Ok(s)
}
