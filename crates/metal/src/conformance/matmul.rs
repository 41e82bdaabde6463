//! Gates for get-rows and the three matmul tiers, for every weight type, against
//! `minfer_gguf::quants::dequantize_row` (the CPU's scalar reference for the formats).

use minfer_gguf::quants::{dequantize_row, random_blocks};
use minfer_gguf::GgmlType;

use super::{e, f32_bytes, i32_bytes, judge, max_err, read_f32, GateFn, GateResult, Rng};
use crate::device::Device;
use crate::error::Error;
use crate::launch::{self, MatmulTier};

/// (kernel suffix, GGUF type id) of every weight type with kernels.
const TYPES: [(&str, u32); 17] = [
    ("f32", 0),
    ("f16", 1),
    ("bf16", 30),
    ("q4_0", 2),
    ("q4_1", 3),
    ("q5_0", 6),
    ("q5_1", 7),
    ("q8_0", 8),
    ("q8_1", 9),
    ("q2_k", 10),
    ("q3_k", 11),
    ("q4_k", 12),
    ("q5_k", 13),
    ("q6_k", 14),
    ("q8_k", 15),
    ("iq4_nl", 20),
    ("iq4_xs", 23),
];

macro_rules! per_type {
    ($v:ident, $D:ty, $fmt:literal, $f:ident) => {
        per_type!(@ $v, $D, $fmt, $f, 0, 1, 30, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 20, 23);
    };
    (@ $v:ident, $D:ty, $fmt:literal, $f:ident, $($id:literal),*) => {
        $(
            let name = TYPES.iter().find(|t| t.1 == $id).map(|t| t.0).unwrap_or("?");
            $v.push((format!($fmt, name), $f::<$D, $id> as GateFn<$D>));
        )*
    };
}

pub fn register<D: Device>(v: &mut Vec<(String, GateFn<D>)>) {
    per_type!(v, D, "get_rows_{}_matches_dequantize_row", get_rows_gate);
    per_type!(v, D, "mv_{}_matches_reference", mv_gate);
    per_type!(v, D, "mv_multi_{}_matches_reference", multi_gate);
    per_type!(v, D, "mm_{}_matches_reference", mm_gate);
    v.push((
        "matmul_tier_follows_the_row_class".into(),
        tier_selection::<D>,
    ));
    v.push((
        "matmul_rows_are_bitwise_equal_within_their_class".into(),
        class_rows_invariant::<D>,
    ));
    v.push((
        "matmul_refuses_a_type_without_kernels".into(),
        refuses_unkerneled::<D>,
    ));
}

fn ty_of(id: u32) -> Result<GgmlType, String> {
    GgmlType::from_id(id).ok_or_else(|| format!("no ggml type {id}"))
}

/// Random rows of `ty` and their f32 dequantization by the CPU reference.
fn weights(ty: GgmlType, rows: usize, k: usize, seed: u64) -> Result<(Vec<u8>, Vec<f32>), String> {
    let bs = ty.block_size() as usize;
    let data = random_blocks(ty, rows * k / bs, seed);
    let rb = data.len() / rows;
    let mut deq = vec![0f32; rows * k];
    for (r, out) in deq.chunks_mut(k).enumerate() {
        dequantize_row(ty, &data[r * rb..][..rb], out).map_err(e)?;
    }
    Ok((data, deq))
}

fn get_rows_gate<D: Device, const ID: u32>(dev: &D) -> GateResult {
    let ty = ty_of(ID)?;
    let (ncols, n_rows) = (512, 6);
    let ids = [5i32, 0, 3, 3];
    let (data, deq) = weights(ty, n_rows, ncols, 100 + ID as u64)?;
    // The table sits at a non-zero offset, as a weight inside a wrapped GGUF part does.
    let offset = 256usize;
    let mut with_prefix = vec![0xAAu8; offset];
    with_prefix.extend_from_slice(&data);
    let wb = dev.buffer_from(&with_prefix).map_err(e)?;
    let ib = dev.buffer_from(&i32_bytes(&ids)).map_err(e)?;
    let out = dev.new_buffer(ids.len() * ncols * 4).map_err(e)?;
    launch::launch_get_rows(
        dev,
        ty,
        &wb,
        offset as u64,
        &ib,
        &out,
        ncols,
        n_rows,
        ids.len(),
    )
    .map_err(e)?;
    let got = read_f32(dev, &out, ids.len() * ncols)?;
    let want: Vec<f64> = ids
        .iter()
        .flat_map(|&i| deq[i as usize * ncols..][..ncols].iter().map(|&v| v as f64))
        .collect();
    // Same products as the reference, possibly associated differently (d*sc*q) or contracted
    // into an FMA on the device: 1e-6 relative to max(1, |ref|).
    let err = max_err(&got, &want, |i| want[i].abs().max(1.0));
    judge(
        &format!("get_rows {}", ty.name()),
        f32_bytes(&got),
        err,
        1e-6,
    )
}

/// Mat-vec and multi-row bound, relative to sum |w*x| (k = 256): f32 sums in another order.
/// Measured max 5.5e-8 (q2_k) on the emulator (2026-12-01); the bound is 9x that.
const MV_TOL: f64 = 5e-7;
/// GEMM with weights rounded to half in threadgroup memory: measured max 9.1e-5 (q4_k); the
/// bound is 6.6x that (half's 2^-11 per weight makes the class).
const GEMM_HALF_TOL: f64 = 6e-4;
/// GEMM on f16 / bf16 weights (exact in half): measured max 1.4e-7; the bound is 7x that.
const GEMM_EXACT_TOL: f64 = 1e-6;

fn matmul_case<D: Device>(dev: &D, id: u32, tier: MatmulTier, nt: usize) -> GateResult {
    let ty = ty_of(id)?;
    let (k, n) = (256, 72); // 72 rows: one full 64-row GEMM tile plus a partial one
    let (data, deq) = weights(ty, n, k, 200 + id as u64)?;
    let x = Rng::new(300 + id as u64).vec(nt * k);
    let wb = dev.buffer_from(&data).map_err(e)?;
    let xb = dev.buffer_from(&f32_bytes(&x)).map_err(e)?;
    let out = dev.new_buffer(n * nt * 4).map_err(e)?;
    launch::launch_matmul_tier(dev, tier, ty, &wb, 0, &xb, &out, k, n, nt).map_err(e)?;
    let got = read_f32(dev, &out, n * nt)?;
    let mut want = Vec::with_capacity(n * nt);
    let mut mag = Vec::with_capacity(n * nt);
    for t in 0..nt {
        let xr = &x[t * k..][..k];
        for r in 0..n {
            let wr = &deq[r * k..][..k];
            want.push(
                wr.iter()
                    .zip(xr)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>(),
            );
            mag.push(
                wr.iter()
                    .zip(xr)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum::<f64>(),
            );
        }
    }
    // Tolerance relative to sum |w*x| of the output: mat-vec / multi-row accumulate f32 in
    // another order (`MV_TOL`); the GEMM also rounds weights to half in threadgroup memory
    // (2^-11 = 4.9e-4 per weight, `GEMM_HALF_TOL`), except f16 / bf16 weights, which half
    // holds exactly (`GEMM_EXACT_TOL`).
    let exact_in_half = matches!(ty, GgmlType::F16 | GgmlType::Bf16);
    let tol = match tier {
        MatmulTier::Gemm if !exact_in_half => GEMM_HALF_TOL,
        MatmulTier::Gemm => GEMM_EXACT_TOL,
        _ => MV_TOL,
    };
    let err = max_err(&got, &want, |i| mag[i].max(1e-3));
    judge(
        &format!("{tier:?} {} nt={nt}", ty.name()),
        f32_bytes(&got),
        err,
        tol,
    )
}

fn mv_gate<D: Device, const ID: u32>(dev: &D) -> GateResult {
    matmul_case(dev, ID, MatmulTier::Mv, 1)
}
fn multi_gate<D: Device, const ID: u32>(dev: &D) -> GateResult {
    matmul_case(dev, ID, MatmulTier::Multi, 5)
}
fn mm_gate<D: Device, const ID: u32>(dev: &D) -> GateResult {
    matmul_case(dev, ID, MatmulTier::Gemm, 40)
}

/// The tier of a run follows its row class, never its row count: generation rows on the
/// mat-vec (one) or multi-row kernel (more, 16 included), prompt rows on the GEMM (one
/// included); the row-count choice (the gates' control) differs from it at 1 prompt row and
/// 16 generation rows.
fn tier_selection<D: Device>(dev: &D) -> GateResult {
    use minfer_graph::RowClass::{Generation, Prompt};
    let mut log = Vec::new();
    for (class, nt, want, by_rows) in [
        (Generation, 1usize, MatmulTier::Mv, MatmulTier::Mv),
        (Generation, 5, MatmulTier::Multi, MatmulTier::Multi),
        (Generation, 16, MatmulTier::Multi, MatmulTier::Gemm),
        (Prompt, 1, MatmulTier::Gemm, MatmulTier::Mv),
        (Prompt, 5, MatmulTier::Gemm, MatmulTier::Multi),
        (Prompt, 64, MatmulTier::Gemm, MatmulTier::Gemm),
    ] {
        let (k, n) = (32, 72);
        let wb = dev.new_buffer(n * k * 4).map_err(e)?;
        let xb = dev.new_buffer(nt * k * 4).map_err(e)?;
        let out = dev.new_buffer(n * nt * 4).map_err(e)?;
        let got = launch::launch_matmul(dev, class, GgmlType::F32, &wb, 0, &xb, &out, k, n, nt)
            .map_err(e)?;
        dev.submit().map_err(e)?;
        if got != want {
            return Err(format!(
                "{class:?} x {nt}: chose {got:?}, the row class says {want:?}"
            ));
        }
        let rows = launch::rows_tier(dev, k, n, nt);
        if rows != by_rows {
            return Err(format!(
                "{nt} rows: the control chose {rows:?}, want {by_rows:?}"
            ));
        }
        log.push(got as u8);
    }
    judge("tier selection", log, 0.0, 0.0)
}

/// Within a class a row's bits do not depend on the run it is in: a generation row alone
/// (mat-vec) equals the same row as row i of 2, 5 and 16 (multi-row kernel) and inside a
/// node's rows at an offset (`launch_matmul_rows`); a prompt row equals itself on the GEMM
/// alone, among 7, 33 and 64 rows (partial and full 32-row token tiles) and at an offset.
/// Control: the row-count choice (16 rows on the GEMM) changes the generation row's bits.
/// Types: f32, q8_0 and q4_k (k = 256, 72 outputs: a full and a partial 64-row tile).
fn class_rows_invariant<D: Device>(dev: &D) -> GateResult {
    use minfer_graph::RowClass::{Generation, Prompt};
    let (k, n) = (256usize, 72usize);
    let mut out = Vec::new();
    for ty in [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4K] {
        let (data, _) = weights(ty, n, k, 400 + ty as u64)?;
        let wb = dev.buffer_from(&data).map_err(e)?;
        let row = Rng::new(401).vec(k);
        // `nt` rows with `row` as row `at`, the others other values; the output's row `at`.
        let run =
            |tier: MatmulTier, nt: usize, at: usize, row0: usize| -> Result<Vec<u32>, String> {
                let mut x = Rng::new(402 + nt as u64).vec((row0 + nt) * k);
                x[(row0 + at) * k..][..k].copy_from_slice(&row);
                let xb = dev.buffer_from(&f32_bytes(&x)).map_err(e)?;
                let ob = dev.new_buffer((row0 + nt) * n * 4).map_err(e)?;
                launch::launch_matmul_rows(dev, tier, ty, &wb, 0, &xb, &ob, k, n, row0, nt)
                    .map_err(e)?;
                let got = read_f32(dev, &ob, (row0 + nt) * n)?;
                Ok(got[(row0 + at) * n..][..n]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect())
            };
        let tier = |c, nt| launch::class_tier(dev, c, k, nt);
        let alone = run(tier(Generation, 1), 1, 0, 0)?;
        for (nt, at, row0) in [(2, 1, 0), (5, 3, 0), (16, 9, 0), (5, 2, 3)] {
            if run(tier(Generation, nt), nt, at, row0)? != alone {
                return Err(format!(
                    "{ty}: a generation row differs as row {at} of {nt} (offset {row0})"
                ));
            }
        }
        let prompt = run(tier(Prompt, 1), 1, 0, 0)?;
        for (nt, at, row0) in [(7, 6, 0), (33, 32, 0), (64, 17, 0), (7, 0, 5)] {
            if run(tier(Prompt, nt), nt, at, row0)? != prompt {
                return Err(format!(
                    "{ty}: a prompt row differs as row {at} of {nt} (offset {row0})"
                ));
            }
        }
        // Control: the row-count choice puts 16 generation rows on the GEMM.
        if run(launch::rows_tier(dev, k, n, 16), 16, 9, 0)? == alone {
            return Err(format!(
                "{ty}: control: the row-count tier left the bits unchanged"
            ));
        }
        out.extend(alone.iter().chain(&prompt).flat_map(|b| b.to_le_bytes()));
    }
    judge("row-class invariance", out, 0.0, 0.0)
}

fn refuses_unkerneled<D: Device>(dev: &D) -> GateResult {
    let b = dev.new_buffer(4096).map_err(e)?;
    match launch::launch_mv(dev, GgmlType::Iq2Xxs, &b, 0, &b, &b, 256, 1) {
        Err(Error::UnsupportedType { ty, .. }) if ty.contains("IQ2_XXS") => {}
        other => return Err(format!("IQ2_XXS weight was not refused by name: {other:?}")),
    }
    judge("refusal", Vec::new(), 0.0, 0.0)
}
