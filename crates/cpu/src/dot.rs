//! The dot-product dispatch point, resolved once per matmul: the SIMD kernel of this
//! machine's instruction set when [`crate::simd`] has one for the weight type (bit-identical to
//! the reference, `tests/simd_exact.rs`), else the portable kernels of [`crate::fastdot`]
//! (bit-identical too, `tests/fastdot.rs`), else the scalar reference of `minfer_gguf::quants`.

use crate::{fastdot, simd};
use minfer_gguf::{quants, GgmlType};

/// The kernel a matmul calls per (weight row, activation row).
#[derive(Clone, Copy)]
pub enum RowKernel {
    Simd(simd::RowDot),
    Portable(GgmlType, DotFn),
}

impl RowKernel {
    pub fn for_type(ty: GgmlType) -> RowKernel {
        match simd::RowDot::new(ty) {
            Ok(r) if r.isa() != simd::Isa::Scalar => RowKernel::Simd(r),
            _ => RowKernel::Portable(ty, select(ty)),
        }
    }

    /// The SIMD kernel without per-call checks, for rows of `n` elements of `w_len` weight and
    /// `a_len` activation bytes that fit it (checked here, once per matmul).
    pub fn bare(&self, n: usize, w_len: usize, a_len: usize) -> Option<simd::DotFn> {
        match self {
            RowKernel::Simd(r) => r.kernel_for(n, w_len, a_len),
            RowKernel::Portable(..) => None,
        }
    }

    /// [`RowKernel::bare`] for 4 activation rows at once, where the type has such a kernel.
    pub fn bare4(&self, n: usize, w_len: usize, a_len: usize) -> Option<simd::Dot4Fn> {
        match self {
            RowKernel::Simd(r) => r.kernel4_for(n, w_len, a_len),
            RowKernel::Portable(..) => None,
        }
    }

    /// The tile kernel ([`simd::TILE`] activation rows at once), where the type has one.
    pub fn tile(&self, n: usize, w_len: usize, a_len: usize) -> Option<simd::TileFn> {
        match self {
            RowKernel::Simd(r) => r.tile_for(n, w_len, a_len),
            RowKernel::Portable(..) => None,
        }
    }

    /// The two-tile kernel (2 × [`simd::TILE`] activation rows at once), where the type has one.
    pub fn tile_pair(&self, n: usize, w_len: usize, a_len: usize) -> Option<simd::TilePairFn> {
        match self {
            RowKernel::Simd(r) => r.tile_pair_for(n, w_len, a_len),
            RowKernel::Portable(..) => None,
        }
    }

    /// The side kernel (activation facts from the matmul's side table), where the type has one.
    pub fn side(&self, n: usize, w_len: usize, a_len: usize) -> Option<simd::RowSideFn> {
        match self {
            RowKernel::Simd(r) => r.side_for(n, w_len, a_len),
            RowKernel::Portable(..) => None,
        }
    }

    #[inline]
    pub fn dot(&self, n: usize, w: &[u8], a: &[u8]) -> minfer_gguf::Result<f32> {
        match self {
            RowKernel::Simd(r) => r.dot(n, w, a),
            RowKernel::Portable(ty, f) => f(*ty, n, w, a),
        }
    }
}

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
