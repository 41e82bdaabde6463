//! The reference's outputs of a matmul over quantized rows (feature `quants`): what the CPU
//! backend's exact gates hold every kernel and layout to.

use minfer_gguf::quants::{self, vec_dot_type};
use minfer_gguf::GgmlType;

/// Output t · m + o: the reference's dot (`quants::vec_dot`) of row o of `w` (`m` plain
/// rows of `ty`, `k` wide) with token row t of `x` (`x.len() / k` rows) quantized to `ty`'s
/// activation type, one token at a time.
pub fn matmul(ty: GgmlType, k: usize, m: usize, w: &[u8], x: &[f32]) -> Vec<f32> {
    let at = vec_dot_type(ty);
    let arb = at.row_bytes(k as u64).unwrap() as usize;
    let wrb = ty.row_bytes(k as u64).unwrap() as usize;
    let nt = x.len() / k;
    let mut want = vec![0f32; nt * m];
    let mut a = vec![0u8; arb];
    for t in 0..nt {
        quants::quantize_row(at, &x[t * k..(t + 1) * k], &mut a).unwrap();
        for o in 0..m {
            want[t * m + o] = quants::vec_dot(ty, k, &w[o * wrb..(o + 1) * wrb], &a).unwrap();
        }
    }
    want
}
