//! Gates for the graph's small ops: RoPE with a frequency scale against the CPU's angle
//! recurrence and the f64 formula, SiLU, the row-broadcast add, and the KV RoPE shift against
//! the CPU's `rope_shift` semantics.

use minfer_graph::RopeStyle;

use super::reference as refr;
use super::{e, f32_bytes, i32_bytes, judge, max_err, read_f32, GateFn, GateResult, Rng};
use crate::device::Device;
use crate::launch::{self, KvType};

pub fn register<D: Device>(v: &mut Vec<(String, GateFn<D>)>) {
    let list: [(&str, GateFn<D>); 7] = [
        (
            "rope_freq_scale_matches_the_cpu_formula",
            rope_freq_scale::<D>,
        ),
        ("silu_matches_reference", silu::<D>),
        ("add_rows_is_exact", add_rows::<D>),
        ("kv_rope_shift_f32_matches_the_cpu", shift::<D, 0>),
        ("kv_rope_shift_f16_matches_the_cpu", shift::<D, 1>),
        (
            "kv_rope_shift_refuses_q8_0_and_bad_ranges",
            shift_refuses::<D>,
        ),
        ("kv_rope_shift_no_op_changes_nothing", shift_no_op::<D>),
    ];
    v.extend(list.into_iter().map(|(n, f)| (n.to_string(), f)));
}

/// Against the CPU's f32 recurrence: sin/cos of the same f32 angle, so a few ulps at most
/// on a device whose precise:: sin/cos differ from glibc's (the emulator: exact).
const TOL_CPU: f64 = 2e-6;
/// Against the f64 formula (the existing rope gates' bar): f32 angle error.
const TOL_F64: f64 = 5e-5;

fn rope_freq_scale<D: Device>(dev: &D) -> GateResult {
    let (hd, nh) = (64, 3);
    let pos: Vec<i32> = vec![0, 1, 7, 42, 99, 1000];
    let nt = pos.len();
    let fs = 0.25f32;
    let mut r = Rng::new(57);
    let x = r.vec(hd * nh * nt);
    let pb = dev.buffer_from(&i32_bytes(&pos)).map_err(e)?;
    let mut out = Vec::new();
    let mut worst = 0.0f64;
    for style in [RopeStyle::Neox, RopeStyle::Normal] {
        let inter = style == RopeStyle::Normal;
        let run = |scale: f32| -> Result<Vec<f32>, String> {
            let xb = dev.buffer_from(&f32_bytes(&x)).map_err(e)?;
            let db = dev.new_buffer(x.len() * 4).map_err(e)?;
            launch::launch_rope(dev, &xb, &pb, &db, hd, nh, nt, hd, 10000.0, scale, style)
                .map_err(e)?;
            read_f32(dev, &db, x.len())
        };
        let got = run(fs)?;
        let heads = x.chunks(hd).enumerate();
        let cpu: Vec<f64> = heads
            .clone()
            .flat_map(|(i, h)| refr::rope_cpu_f32(h, pos[i / nh], 10000.0, fs, inter))
            .map(|v| v as f64)
            .collect();
        let exact: Vec<f64> = heads
            .flat_map(|(i, h)| refr::rope(h, pos[i / nh], hd, 10000.0, fs, inter))
            .collect();
        let err_cpu = max_err(&got, &cpu, |_| 1.0);
        let err_f64 = max_err(&got, &exact, |_| 1.0);
        if err_cpu > TOL_CPU || err_f64 > TOL_F64 {
            return Err(format!(
                "{style:?}: max error {err_cpu:.3e} vs the CPU recurrence (bar {TOL_CPU:.1e}), \
                 {err_f64:.3e} vs f64 (bar {TOL_F64:.1e})"
            ));
        }
        // control: the unscaled rotation must fail the bar
        let unscaled = max_err(&run(1.0)?, &cpu, |_| 1.0);
        if unscaled <= TOL_CPU {
            return Err(format!(
                "{style:?}: control: freq_scale 1 is within {unscaled:.3e} of the scaled rope"
            ));
        }
        worst = worst.max(err_cpu);
        out.extend(f32_bytes(&got));
    }
    judge("rope freq_scale", out, worst, TOL_CPU)
}

fn silu<D: Device>(dev: &D) -> GateResult {
    let n = 1000;
    let x: Vec<f32> = Rng::new(61).vec(n).iter().map(|v| v * 12.0).collect();
    let xb = dev.buffer_from(&f32_bytes(&x)).map_err(e)?;
    // in place
    launch::launch_silu(dev, &xb, &xb, n).map_err(e)?;
    let got = read_f32(dev, &xb, n)?;
    let want: Vec<f64> = x
        .iter()
        .map(|&v| v as f64 / (1.0 + (-(v as f64)).exp()))
        .collect();
    // relative to max(|y|, 1e-3): exp and divide in f32
    let err = max_err(&got, &want, |i| want[i].abs().max(1e-3));
    judge("silu", f32_bytes(&got), err, 1e-6)
}

fn add_rows<D: Device>(dev: &D) -> GateResult {
    // 300 columns (a partial second threadgroup), 7 rows, in place
    let (ncols, nrows) = (300, 7);
    let mut r = Rng::new(63);
    let x = r.vec(ncols * nrows);
    let b = r.vec(ncols);
    let xb = dev.buffer_from(&f32_bytes(&x)).map_err(e)?;
    let bb = dev.buffer_from(&f32_bytes(&b)).map_err(e)?;
    launch::launch_add_rows(dev, &xb, &bb, &xb, ncols, nrows).map_err(e)?;
    let got = read_f32(dev, &xb, x.len())?;
    let want: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| (v + b[i % ncols]) as f64)
        .collect();
    let err = max_err(&got, &want, |_| 1.0);
    judge("add_rows", f32_bytes(&got), err, 0.0)
}

/// The CPU's rope_shift on the values of one cell: every head rotated at position `delta`
/// with the CPU's recurrence, f16 rounded back to nearest even.
fn shift_ref(row: &[f32], hd: usize, delta: i32, fs: f32, inter: bool, f16: bool) -> Vec<f32> {
    row.chunks(hd)
        .flat_map(|h| refr::rope_cpu_f32(h, delta, 10000.0, fs, inter))
        .map(|v| {
            if f16 {
                half::f16::from_f32(v).to_f32()
            } else {
                v
            }
        })
        .collect()
}

fn shift<D: Device, const KV: u8>(dev: &D) -> GateResult {
    let (nkv, hd, n_cells) = (2, 64, 12);
    let stride = nkv * hd;
    let f16 = KV == 1;
    let kv = if f16 { KvType::F16 } else { KvType::F32 };
    let mut out = Vec::new();
    let mut worst = 0.0f64;
    for (style, cell, n, delta, fs) in [
        (RopeStyle::Neox, 3, 6, -5i64, 1.0f32),
        (RopeStyle::Normal, 0, 12, 37, 0.5),
    ] {
        let mut vals = Rng::new(70 + cell as u64).vec(n_cells * stride);
        let bytes: Vec<u8> = if f16 {
            vals.iter_mut()
                .flat_map(|v| {
                    let h = half::f16::from_f32(*v);
                    *v = h.to_f32();
                    h.to_le_bytes()
                })
                .collect()
        } else {
            f32_bytes(&vals)
        };
        let region = dev.buffer_from(&bytes).map_err(e)?;
        launch::launch_kv_rope_shift(
            dev, kv, &region, nkv, hd, n_cells, cell, n, delta, 10000.0, fs, style,
        )
        .map_err(e)?;
        dev.submit().map_err(e)?;
        let mut got_bytes = vec![0u8; bytes.len()];
        dev.read_bytes(&region, 0, &mut got_bytes).map_err(e)?;
        let eb = if f16 { 2 } else { 4 };
        // cells outside the range must keep their bytes
        for c in (0..n_cells).filter(|&c| c < cell || c >= cell + n) {
            let span = c * stride * eb..(c + 1) * stride * eb;
            if got_bytes[span.clone()] != bytes[span] {
                return Err(format!("cell {c} outside {cell}..{} changed", cell + n));
            }
        }
        let got: Vec<f32> = if f16 {
            got_bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect()
        } else {
            super::to_f32s(&got_bytes)
        };
        let inter = style == RopeStyle::Normal;
        let want: Vec<f64> = vals
            .chunks(stride)
            .enumerate()
            .flat_map(|(c, row)| {
                if c >= cell && c < cell + n {
                    shift_ref(row, hd, delta as i32, fs, inter, f16)
                } else {
                    row.to_vec()
                }
            })
            .map(|v| v as f64)
            .collect();
        // f16: one half ulp (<= 4.9e-4 below 1) where the f32 rotations round differently
        let tol = if f16 { 5e-4 } else { TOL_CPU };
        let err = max_err(&got, &want, |_| 1.0);
        if err > tol {
            return Err(format!(
                "{style:?} cells {cell}..{}: max error {err:.3e} exceeds {tol:.1e}",
                cell + n
            ));
        }
        worst = worst.max(err);
        out.extend(got_bytes);
    }
    judge(
        "kv rope shift",
        out,
        worst,
        if f16 { 5e-4 } else { TOL_CPU },
    )
}

fn shift_refuses<D: Device>(dev: &D) -> GateResult {
    let (nkv, hd, n_cells) = (2, 64, 4);
    let q8 = launch::q8_0_row_bytes(nkv * hd);
    let region = dev.new_buffer(n_cells * q8.max(nkv * hd * 4)).map_err(e)?;
    let call = |kv, cell, n, delta| {
        launch::launch_kv_rope_shift(
            dev,
            kv,
            &region,
            nkv,
            hd,
            n_cells,
            cell,
            n,
            delta,
            10000.0,
            1.0,
            RopeStyle::Neox,
        )
    };
    let mut msgs = Vec::new();
    match call(KvType::Q8_0, 0, 2, 3) {
        Err(crate::Error::UnsupportedType { ty, .. }) if ty.contains("q8_0") => msgs.push(ty),
        other => return Err(format!("a q8_0 shift was not refused: {other:?}")),
    }
    // a q8_0 no-op succeeds, as on the CPU
    call(KvType::Q8_0, 0, 2, 0).map_err(|m| format!("q8_0 no-op refused: {m}"))?;
    match call(KvType::F32, 3, 2, 1) {
        Err(err) if err.to_string().contains("cells 3..5") => msgs.push(err.to_string()),
        other => return Err(format!("cells past the region were not refused: {other:?}")),
    }
    match call(KvType::F16, 0, 1, 1 << 40) {
        Err(err) if err.to_string().contains("does not fit") => msgs.push(err.to_string()),
        other => return Err(format!("a huge delta was not refused: {other:?}")),
    }
    judge(
        "kv rope shift refusals",
        msgs.join("\n").into_bytes(),
        0.0,
        0.0,
    )
}

fn shift_no_op<D: Device>(dev: &D) -> GateResult {
    let (nkv, hd, n_cells) = (1, 64, 3);
    let bytes = f32_bytes(&Rng::new(90).vec(n_cells * nkv * hd));
    let region = dev.buffer_from(&bytes).map_err(e)?;
    for (n, delta) in [(0usize, 5i64), (3, 0)] {
        launch::launch_kv_rope_shift(
            dev,
            KvType::F32,
            &region,
            nkv,
            hd,
            n_cells,
            0,
            n,
            delta,
            10000.0,
            1.0,
            RopeStyle::Neox,
        )
        .map_err(e)?;
    }
    dev.submit().map_err(e)?;
    let mut got = vec![0u8; bytes.len()];
    dev.read_bytes(&region, 0, &mut got).map_err(e)?;
    let err = if got == bytes { 0.0 } else { f64::INFINITY };
    judge("kv rope shift no-op", got, err, 0.0)
}
