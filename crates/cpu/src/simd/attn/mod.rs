//! Row kernels of the flash attention (`ops::attn`): the scores of one query row against a list
//! of KV cells, and the probability-weighted sum of a list of V cells into an accumulator. They
//! read each cell's head in its storage type (F32, F16, Q8_0) in place: no dequantized copy.
//!
//! Cells are given as byte offsets of their heads, in the row's logical order, so one call can
//! cover cells from several runs of a KV map. A cell's score depends on its position in the
//! list only through the kernel's fixed grouping (the AVX2 scores reduce 4 consecutive list
//! entries together): the flash kernel always passes a logical block's cells from the block's
//! start, so the grouping is a function of logical indices alone. The accumulation is a chain
//! per output element over the list in order, so calling it on consecutive pieces of a list
//! gives the bits of one call over the whole list.
//!
//! Unlike the dots of this module's parent these are not bit-identical to a scalar reference
//! (the AVX2 kernels use FMA and 8-lane partial sums); attention is a tolerance gate
//! (`tests/attn_flash.rs`), so the portable and AVX2 kernels agree to f32 rounding, not bits.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod portable;

use super::Isa;
use minfer_gguf::{Error, GgmlType, Result};

/// `scores(q, k, cells, out)`: `out[j] = q · K_j` for `j < out.len()` (`cells.len()` is
/// `out.len()`), where `K_j` is the head of `q.len()` elements at `k[cells[j]..]` in the
/// kernel's storage type.
pub type ScoresFn = fn(q: &[f32], k: &[u8], cells: &[usize], out: &mut [f64]);
/// `accum(acc, v, cells, p)`: `acc += Σ_j p[j] * V_j` for `j < p.len()` in order (`cells.len()`
/// is `p.len()`), where `V_j` is the head of `acc.len()` elements at `v[cells[j]..]`.
pub type AccumFn = fn(acc: &mut [f32], v: &[u8], cells: &[usize], p: &[f32]);

/// The two row kernels for one KV storage type on one instruction set.
#[derive(Clone, Copy)]
pub struct KvKernels {
    pub scores: ScoresFn,
    pub accum: AccumFn,
    /// The instruction set that actually runs them.
    pub isa: Isa,
}

impl KvKernels {
    /// The best kernels of this machine for KV cells of `ty`.
    pub fn new(ty: GgmlType) -> Result<KvKernels> {
        KvKernels::on(super::detected(), ty)
    }

    /// The kernels of `isa` for `ty`: AVX2 needs FMA besides AVX2 and F16C (a typed error
    /// where this CPU lacks any); instruction sets without attention kernels (NEON) run the
    /// portable ones, and [`KvKernels::isa`] says so.
    pub fn on(isa: Isa, ty: GgmlType) -> Result<KvKernels> {
        if !isa.is_available() {
            return Err(Error::Invalid(format!(
                "{isa} attention kernels requested, but this CPU lacks the {isa} instruction set"
            )));
        }
        let portable = portable::kernels(ty).ok_or_else(|| unsupported(ty))?;
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                if !avx2::supported() {
                    return Err(Error::Invalid(
                        "avx2 attention kernels need FMA, which this CPU lacks".into(),
                    ));
                }
                avx2::kernels(ty).ok_or_else(|| unsupported(ty))
            }
            // AVX-512 machines run the AVX2 row kernels (there are no AVX-512 ones): an x86
            // machine then attends with the same bits whichever of the two it has.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni if avx2::supported() => {
                avx2::kernels(ty).ok_or_else(|| unsupported(ty))
            }
            _ => Ok(portable),
        }
    }
}

fn unsupported(ty: GgmlType) -> Error {
    Error::Invalid(format!(
        "attention over a {ty} KV cache is not implemented (f32, f16 and q8_0 are)"
    ))
}

/// Bytes of one head of `hd` elements of `ty` (a whole number of blocks, checked by the caller).
fn head_bytes(ty: GgmlType, hd: usize) -> usize {
    match ty {
        GgmlType::F32 => 4 * hd,
        GgmlType::F16 => 2 * hd,
        _ => hd / 32 * 34,
    }
}

/// Checks that the heads of `hb` bytes at the byte offsets `cells` lie inside `bytes` and that
/// there are `n` of them (once per call, so the kernels can read cells through raw pointers).
#[inline]
fn check_cells(bytes: &[u8], cells: &[usize], n: usize, hb: usize) {
    assert_eq!(cells.len(), n, "{} KV cells for {n} values", cells.len());
    let last = cells.iter().copied().max().unwrap_or(0);
    assert!(
        cells.is_empty() || last.checked_add(hb).is_some_and(|e| e <= bytes.len()),
        "a KV head of {hb} bytes at offset {last} exceeds the {} bytes given",
        bytes.len()
    );
}
