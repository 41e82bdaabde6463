//! Row gathers: embedding lookup from a weight, and the tail rows of an activation.

use super::{as_i32, KResult, KernelError};
use minfer_gguf::{quants, GgmlType};

/// Dequantizes weight rows `ids` (`n_rows` rows of `ne0` elements of `ty`) into `out`.
pub fn get_rows(
    ty: GgmlType,
    w: &[u8],
    ne0: usize,
    n_rows: usize,
    ids: &[f32],
    out: &mut [f32],
) -> KResult<()> {
    let rb = ty.row_bytes(ne0 as u64).unwrap_or(0) as usize;
    for (o, &id) in out.chunks_exact_mut(ne0).zip(ids) {
        let id = as_i32(id);
        if id < 0 || id as usize >= n_rows {
            return Err(KernelError(format!("row id {id} out of range 0..{n_rows}")));
        }
        let r = id as usize;
        quants::dequantize_row(ty, &w[r * rb..(r + 1) * rb], o)?;
    }
    Ok(())
}

/// Copies rows `ids` of `x` (`[rows][d]`) into `out`.
pub fn select_rows(x: &[f32], d: usize, ids: &[f32], out: &mut [f32]) -> KResult<()> {
    let n_rows = x.len() / d;
    for (o, &id) in out.chunks_exact_mut(d).zip(ids) {
        let id = as_i32(id);
        if id < 0 || id as usize >= n_rows {
            return Err(KernelError(format!(
                "tail row {id} out of range 0..{n_rows}"
            )));
        }
        let r = id as usize;
        o.copy_from_slice(&x[r * d..(r + 1) * d]);
    }
    Ok(())
}
