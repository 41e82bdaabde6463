//! The kernel gate suite, written once against [`Device`] so the emulator (CI, Linux, under
//! three schedules) and a real Mac (`scripts/mac-gate`) run the same checks.
//!
//! Every gate drives a launch fn with seeded inputs, compares with an independent scalar
//! reference (f64 math, or `minfer_gguf::quants` for the weight formats) under a tolerance
//! named in the gate before measuring, and returns the output bytes so a caller can demand
//! bit-identical results across schedules.
//!
//! Controls (rule 2), each tried on a copy of the kernels and seen to fail the gates named:
//! - RMSNorm without the barrier between the row total's write and its readers: the threads
//!   of other simdgroups read NaN poison (`rms_norm_*`, error inf).
//! - RMSNorm with eps added after the square root (`1 / (sqrt(ms) + eps)`): the rows with
//!   values ~1e-3 (mean square below eps) err 1.0 relative, the eps-0.25 rows 7.9e-2, the
//!   old rows (values ~1, eps 1e-6) only 3.8e-7 (`rms_norm_*`, bound 4.8e-7).
//! - The q8_0 KV store rounding ties to even (`rint` in `mf_quant_q8_0`), or the CPU quantizer
//!   doing so (`round_ties_even` in `quant_8bit`): 186 differing bytes on the tie rows
//!   (`store_kv_q8_0_*`).
//! - Classic attention without the barrier that ends each 32-row block: scores are overwritten
//!   while other threads still read them (`attn_classic_*`, 0.39 / 0.17).
//! - Q4_K dequantizer reading the other nibble: `get_rows_q4_k` (2.6), `mv_q4_k` (0.18),
//!   `mv_multi_q4_k` / `mm_q4_k` (0.34).
//! - Split window pass 1 without the barrier between the weights' write and the V sum
//!   (`window_split_*`, inf: NaN poison); three-pass softmax without the barrier between the
//!   maxima's last read and the sums' write (`window_three_pass_*`, 0.040); prefill-flash
//!   tiles led by their first query instead of the longest (`window_prefill_flash_*`, 0.11,
//!   and the tile pin of the tail gate); tiles grouped without comparing mappings
//!   (`window_prefill_flash_*`, 1.7-1.9, and `window_prefill_flash_is_batch_invariant`).
//! - The flash-prefill tail read from the last 64 rows (the design's recorded bug) is built in
//!   as `flash_prefill_tail_overlap_bug_is_caught` (causal) and
//!   `window_prefill_flash_tail_overlap_bug_is_caught` (windows), which fail unless every
//!   tail case errs.

mod attention;
mod basic;
mod index_tails;
mod matmul;
mod ops;
mod reference;
mod window;
mod window_fast;
mod window_invariance;

use crate::device::Device;

/// A gate's result: the raw output (for cross-schedule comparison) and the measured error.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub output: Vec<u8>,
    pub max_err: f64,
    pub tolerance: f64,
}

/// A gate failure, with the numbers that made it fail.
pub type GateResult = Result<Outcome, String>;

/// A gate, instantiated for one device type.
pub type GateFn<D> = fn(&D) -> GateResult;

/// Every gate, by name.
pub fn gates<D: Device>() -> Vec<(String, GateFn<D>)> {
    let mut v: Vec<(String, GateFn<D>)> = Vec::new();
    basic::register(&mut v);
    matmul::register(&mut v);
    attention::register(&mut v);
    window::register(&mut v);
    window_fast::register(&mut v);
    index_tails::register(&mut v);
    ops::register(&mut v);
    v
}

/// The gate called `name`.
pub fn gate<D: Device>(name: &str) -> Option<GateFn<D>> {
    gates::<D>()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, f)| f)
}

/// Seeded xorshift values in [-1, 1).
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub(crate) fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next_f32()).collect()
    }
}

pub(crate) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(crate) fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(crate) fn to_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Reads `n` f32 from `buf` after submitting.
pub(crate) fn read_f32<D: Device>(dev: &D, buf: &D::Buffer, n: usize) -> Result<Vec<f32>, String> {
    dev.submit().map_err(|e| e.to_string())?;
    let mut b = vec![0u8; n * 4];
    dev.read_bytes(buf, 0, &mut b).map_err(|e| e.to_string())?;
    Ok(to_f32s(&b))
}

/// Max |got - want| / scale[i] (scale 1 for an absolute bound); NaN anywhere is infinite.
pub(crate) fn max_err(got: &[f32], want: &[f64], scale: impl Fn(usize) -> f64) -> f64 {
    let mut m = 0.0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let e = (g as f64 - w).abs() / scale(i);
        if !e.is_finite() {
            return f64::INFINITY;
        }
        m = m.max(e);
    }
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    m
}

/// Pass when `err <= tol`, else a message naming both.
pub(crate) fn judge(what: &str, output: Vec<u8>, err: f64, tol: f64) -> GateResult {
    if err <= tol {
        Ok(Outcome {
            output,
            max_err: err,
            tolerance: tol,
        })
    } else {
        Err(format!(
            "{what}: max error {err:.3e} exceeds the tolerance {tol:.1e}"
        ))
    }
}

pub(crate) fn e<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}
