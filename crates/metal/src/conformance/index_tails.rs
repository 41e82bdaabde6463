//! The stale-tail gate (the seed's #44 part (b) bug): an index buffer longer than the node's
//! logical length, its tail holding garbage and out-of-range values (a recycled pool buffer
//! keeps a prior graph's tail), must neither fail nor change a launch; the same garbage
//! inside the logical length must be refused. Also: every launch fn that takes a scratch
//! refuses one shorter than it asked for.

use super::window::{build, map_runs, window_values, Case, NH};
use super::{e, f32_bytes, i32_bytes, judge, read_f32, GateFn, GateResult, Rng};
use crate::device::Device;
use crate::launch::{self, AttnShape, KvType, WindowKernel, WindowKind};
use minfer_gguf::GgmlType;

pub fn register<D: Device>(v: &mut Vec<(String, GateFn<D>)>) {
    let list: [(&str, GateFn<D>); 2] = [
        (
            "launches_ignore_index_buffer_tails_past_the_logical_length",
            stale_tails::<D>,
        ),
        ("launches_refuse_a_short_scratch", short_scratch::<D>),
    ];
    v.extend(list.into_iter().map(|(n, f)| (n.to_string(), f)));
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Garbage windows: spans past the region or reversed, map runs of negative length or past
/// the region.
fn garbage(kind: WindowKind) -> Vec<i32> {
    match kind {
        WindowKind::Span => vec![-5, 99_999, 40, 3, 7, 1 << 30],
        WindowKind::Map => {
            let mut w = vec![0; 3 * kind.width()];
            for (i, x) in w.iter_mut().enumerate() {
                *x = [-3, 7, 99_999, 4, 5, -2, 420, 500][i % 8];
            }
            w
        }
    }
}

/// Runs `kernel` over `c` with `window` as its window buffer (scratch as asked).
fn window_launch<D: Device>(
    dev: &D,
    kernel: WindowKernel,
    c: &Case<D::Buffer>,
    window: &D::Buffer,
) -> Result<Vec<f32>, String> {
    let max_len = launch::check_windows(dev, &c.s, window).map_err(e)?;
    let bytes = launch::window_family_scratch_bytes(kernel, &c.s, max_len);
    let scratch = dev.new_buffer(bytes.max(4)).map_err(e)?;
    launch::launch_attention_window_with(
        dev, kernel, &c.s, &c.q, &c.k, &c.v, window, &scratch, &c.out,
    )
    .map_err(e)?;
    read_f32(dev, &c.out, c.want.len())
}

fn stale_tails<D: Device>(dev: &D) -> GateResult {
    let mut out = Vec::new();
    let kernels = [
        WindowKernel::Classic,
        WindowKernel::Flash,
        WindowKernel::Split,
        WindowKernel::PrefillFlash,
        WindowKernel::ThreePass,
    ];
    // window attention, every family, both layouts
    for kind in [WindowKind::Span, WindowKind::Map] {
        let runs = map_runs(&[40, 0, 97]);
        let runs: Vec<_> = match kind {
            WindowKind::Span => runs
                .iter()
                .map(|r| r.iter().take(1).copied().collect())
                .collect(),
            WindowKind::Map => runs,
        };
        let c = build(dev, KvType::F32, 64, 430, kind, &runs, None, &[], 61)?;
        let tight = window_values(kind, &runs);
        let mut long = tight.clone();
        long.extend(garbage(kind));
        let mut inside = tight.clone();
        let w = kind.width();
        inside[w..2 * w].copy_from_slice(&garbage(kind)[..w]);
        let tight_b = dev.buffer_from(&i32_bytes(&tight)).map_err(e)?;
        let long_b = dev.buffer_from(&i32_bytes(&long)).map_err(e)?;
        let inside_b = dev.buffer_from(&i32_bytes(&inside)).map_err(e)?;
        for kernel in kernels {
            let a = window_launch(dev, kernel, &c, &tight_b)?;
            let b = window_launch(dev, kernel, &c, &long_b)
                .map_err(|m| format!("{kernel:?} {kind:?}: a garbage tail failed: {m}"))?;
            if bits(&a) != bits(&b) {
                return Err(format!(
                    "{kernel:?} {kind:?}: a garbage tail changed the output"
                ));
            }
            match window_launch(dev, kernel, &c, &inside_b) {
                Err(m) if m.contains("query 1") => {}
                other => {
                    return Err(format!(
                        "{kernel:?} {kind:?}: garbage at query 1 was not refused: {other:?}"
                    ))
                }
            }
            out.extend(f32_bytes(&b));
        }
    }
    // causal attention by positions: flash decode, flash prefill, classic
    for (nt, hd) in [(1, 64), (4, 128), (4, 80)] {
        let (nkv_h, n_ctx) = (2, 90);
        let shape = AttnShape {
            n_head: NH,
            n_head_kv: nkv_h,
            head_dim: hd,
            n_tokens: nt,
            n_ctx,
            kv: KvType::F32,
        };
        let mut r = Rng::new(62 + hd as u64);
        let q = dev
            .buffer_from(&f32_bytes(&r.vec(nt * NH * hd)))
            .map_err(e)?;
        let k = dev
            .buffer_from(&f32_bytes(&r.vec(n_ctx * nkv_h * hd)))
            .map_err(e)?;
        let v = dev
            .buffer_from(&f32_bytes(&r.vec(n_ctx * nkv_h * hd)))
            .map_err(e)?;
        let o = dev.new_buffer(nt * NH * hd * 4).map_err(e)?;
        let scratch = dev
            .new_buffer(launch::attention_scratch_bytes(&shape).max(4))
            .map_err(e)?;
        let pos: Vec<i32> = (70 - nt as i32..70).collect();
        let mut long = pos.clone();
        long.extend([-7, 1 << 20, n_ctx as i32, 89]);
        let mut inside = pos.clone();
        inside[nt - 1] = 1 << 20;
        let mut results = Vec::new();
        for p in [&pos, &long] {
            let pb = dev.buffer_from(&i32_bytes(p)).map_err(e)?;
            launch::launch_attention(dev, &shape, &q, &k, &v, &pb, &scratch, &o)
                .map_err(|m| format!("nt {nt} hd{hd}: positions {p:?}: {m}"))?;
            results.push(read_f32(dev, &o, nt * NH * hd)?);
        }
        if bits(&results[0]) != bits(&results[1]) {
            return Err(format!(
                "nt {nt} hd{hd}: a garbage positions tail changed the output"
            ));
        }
        let pb = dev.buffer_from(&i32_bytes(&inside)).map_err(e)?;
        if launch::launch_attention(dev, &shape, &q, &k, &v, &pb, &scratch, &o).is_ok() {
            return Err(format!(
                "nt {nt} hd{hd}: a position past the region was accepted"
            ));
        }
        out.extend(f32_bytes(&results[1]));
    }
    // KV store cells and get_rows ids
    let (row, n_ctx) = (64, 6);
    let src = dev
        .buffer_from(&f32_bytes(&Rng::new(63).vec(2 * row)))
        .map_err(e)?;
    let mut regions = Vec::new();
    for cells in [vec![4, 1], vec![4, 1, -1, 99, 6]] {
        let cb = dev.buffer_from(&i32_bytes(&cells)).map_err(e)?;
        let region = dev.new_buffer(row * 4 * n_ctx).map_err(e)?;
        launch::launch_store_kv(dev, KvType::F32, &src, &cb, &region, row, 2, n_ctx)
            .map_err(|m| format!("store_kv cells {cells:?}: {m}"))?;
        regions.push(read_f32(dev, &region, row * n_ctx)?);
    }
    if bits(&regions[0]) != bits(&regions[1]) {
        return Err("store_kv: a garbage cells tail changed the region".into());
    }
    let cb = dev.buffer_from(&i32_bytes(&[4, 99])).map_err(e)?;
    let region = dev.new_buffer(row * 4 * n_ctx).map_err(e)?;
    if launch::launch_store_kv(dev, KvType::F32, &src, &cb, &region, row, 2, n_ctx).is_ok() {
        return Err("store_kv: a cell past the region was accepted".into());
    }
    out.extend(f32_bytes(&regions[1]));
    let table = dev
        .buffer_from(&f32_bytes(&Rng::new(64).vec(5 * row)))
        .map_err(e)?;
    let mut rows = Vec::new();
    for ids in [vec![3, 0, 3], vec![3, 0, 3, -4, 1000, 5]] {
        let ib = dev.buffer_from(&i32_bytes(&ids)).map_err(e)?;
        let dst = dev.new_buffer(3 * row * 4).map_err(e)?;
        launch::launch_get_rows(dev, GgmlType::F32, &table, 0, &ib, &dst, row, 5, 3)
            .map_err(|m| format!("get_rows ids {ids:?}: {m}"))?;
        rows.push(read_f32(dev, &dst, 3 * row)?);
    }
    if bits(&rows[0]) != bits(&rows[1]) {
        return Err("get_rows: a garbage ids tail changed the output".into());
    }
    let ib = dev.buffer_from(&i32_bytes(&[3, 5, 0])).map_err(e)?;
    let dst = dev.new_buffer(3 * row * 4).map_err(e)?;
    if launch::launch_get_rows(dev, GgmlType::F32, &table, 0, &ib, &dst, row, 5, 3).is_ok() {
        return Err("get_rows: a row past the table was accepted".into());
    }
    out.extend(f32_bytes(&rows[1]));
    judge("index buffer tails", out, 0.0, 0.0)
}

/// Each launch fn with a scratch, given 4 bytes less than it asked for, refuses by naming the
/// scratch (and writes nothing); with what it asked for it runs.
fn short_scratch<D: Device>(dev: &D) -> GateResult {
    let mut msgs = Vec::new();
    let (seq_a, _) = super::window::sequences();
    for kernel in [
        WindowKernel::Flash,
        WindowKernel::Split,
        WindowKernel::PrefillFlash,
        WindowKernel::ThreePass,
    ] {
        let c = build(
            dev,
            KvType::F16,
            64,
            460,
            WindowKind::Span,
            &seq_a,
            None,
            &[],
            65,
        )?;
        let max_len = launch::check_windows(dev, &c.s, &c.win).map_err(e)?;
        let mut bytes = launch::window_family_scratch_bytes(kernel, &c.s, max_len);
        if kernel == WindowKernel::PrefillFlash {
            // the pads of its two tiles (the bound covers up to a wave of tiles)
            bytes = 2 * 2 * 64 * c.s.n_head_kv * 64 * 2;
        }
        for (n, ok) in [(bytes - 4, false), (bytes, true)] {
            let scratch = dev.new_buffer(n).map_err(e)?;
            let r = launch::launch_attention_window_with(
                dev, kernel, &c.s, &c.q, &c.k, &c.v, &c.win, &scratch, &c.out,
            );
            match (r, ok) {
                (Ok(()), true) => dev.submit().map_err(e)?,
                (Err(m), false) if m.to_string().contains("scratch") => msgs.push(m.to_string()),
                (r, _) => return Err(format!("{kernel:?} scratch {n} of {bytes}: {r:?}")),
            }
        }
    }
    for (nt, hd) in [(1, 128), (5, 64)] {
        let shape = AttnShape {
            n_head: NH,
            n_head_kv: 2,
            head_dim: hd,
            n_tokens: nt,
            n_ctx: 40,
            kv: KvType::F16,
        };
        let q = dev.new_buffer(nt * NH * hd * 4).map_err(e)?;
        let kv = dev.new_buffer(40 * 2 * hd * 2).map_err(e)?;
        let pos = dev
            .buffer_from(&i32_bytes(&(30..30 + nt as i32).collect::<Vec<_>>()))
            .map_err(e)?;
        let mut bytes = launch::attention_scratch_bytes(&shape);
        if nt == 1 {
            // the bound covers 16 chunks; this position needs the partials of its chunks
            let chunks = launch::decode_chunks(31).0;
            bytes = NH * chunks * (hd + 2) * 4;
        }
        for (n, ok) in [(bytes - 4, false), (bytes, true)] {
            let scratch = dev.new_buffer(n).map_err(e)?;
            let r = launch::launch_attention(dev, &shape, &q, &kv, &kv, &pos, &scratch, &q);
            match (r, ok) {
                (Ok(()), true) => dev.submit().map_err(e)?,
                (Err(m), false) if m.to_string().contains("scratch") => msgs.push(m.to_string()),
                (r, _) => return Err(format!("nt {nt} hd{hd} scratch {n} of {bytes}: {r:?}")),
            }
        }
    }
    judge("short scratch", msgs.join("\n").into_bytes(), 0.0, 0.0)
}
