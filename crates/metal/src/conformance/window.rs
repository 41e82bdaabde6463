//! Gates for attention over explicit windows: every kernel family against the f64 reference
//! (span and kv-map layouts, windows starting past cell 0, the KV tails 72 / 96 / 98 / 128 /
//! 197, windows crossing flash chunks, an empty window, 1 and 13 queries, two sequences whose
//! queries share their mapping), batch invariance with its control, classic vs flash, and the
//! host-side window check. The families past classic and flash are registered in
//! conformance/window_fast.rs.

use minfer_gguf::quants::{dequantize_row, quantize_row};
use minfer_gguf::GgmlType;

use super::reference as refr;
use super::{e, f32_bytes, i32_bytes, judge, max_err, read_f32, GateFn, GateResult, Rng};
use crate::device::Device;
use crate::launch::{self, KvType, WindowAttn, WindowKernel, WindowKind};

/// The attention gates' bar (see conformance/attention.rs): outputs are convex mixes of V
/// rows in [-1, 1], scores and sums in f32. Measured max 1.3e-7 on the emulator (2026-12-01).
pub(super) const TOL: f64 = 4e-6;
/// Classic vs flash: both f32, different summation orders. Measured 1.2e-7.
const TOL_KERNELS: f64 = 1e-6;
/// The head-shape gate scales scores by 4 with head dims up to 512, so |score| reaches ~50
/// and its f32 rounding (2^-24 relative) moves the softmax weights by ~3e-6: measured 7.2e-6
/// (2026-12-01); the bound is 5.5x that.
const TOL_HEAD_SHAPES: f64 = 4e-5;
pub(super) const NH: usize = 4;
pub(super) const NKV: usize = 2;

pub(super) const C: u8 = 0;
pub(super) const F: u8 = 1;
pub(super) const S: u8 = 2;
pub(super) const P: u8 = 3;
pub(super) const T: u8 = 4;

pub fn register<D: Device>(v: &mut Vec<(String, GateFn<D>)>) {
    let list: [(&str, GateFn<D>); 16] = [
        (
            "window_classic_f32_hd64_matches_reference",
            vs_ref::<D, C, 0, 64>,
        ),
        (
            "window_classic_f32_hd128_matches_reference",
            vs_ref::<D, C, 0, 128>,
        ),
        (
            "window_classic_f16_hd64_matches_reference",
            vs_ref::<D, C, 1, 64>,
        ),
        (
            "window_classic_f16_hd128_matches_reference",
            vs_ref::<D, C, 1, 128>,
        ),
        (
            "window_classic_f32_hd80_matches_reference",
            vs_ref::<D, C, 0, 80>,
        ),
        (
            "window_classic_q8_0_hd64_matches_reference",
            vs_ref::<D, C, 2, 64>,
        ),
        (
            "window_flash_f32_hd64_matches_reference",
            vs_ref::<D, F, 0, 64>,
        ),
        (
            "window_flash_f32_hd128_matches_reference",
            vs_ref::<D, F, 0, 128>,
        ),
        (
            "window_flash_f16_hd64_matches_reference",
            vs_ref::<D, F, 1, 64>,
        ),
        (
            "window_flash_f16_hd128_matches_reference",
            vs_ref::<D, F, 1, 128>,
        ),
        ("window_flash_matches_classic", flash_vs_classic::<D>),
        (
            "window_flash_is_batch_invariant",
            super::window_invariance::invariant::<D, F>,
        ),
        (
            "window_classic_is_batch_invariant",
            super::window_invariance::invariant::<D, C>,
        ),
        ("window_attention_at_other_head_shapes", head_shapes::<D>),
        ("window_attention_of_empty_windows_is_zero", empty::<D>),
        (
            "window_attention_refuses_a_run_past_the_region",
            refuses::<D>,
        ),
    ];
    v.extend(list.into_iter().map(|(n, f)| (n.to_string(), f)));
}

pub(super) fn kv_of(k: u8) -> KvType {
    match k {
        0 => KvType::F32,
        1 => KvType::F16,
        _ => KvType::Q8_0,
    }
}

pub(super) fn kernel_of(k: u8) -> WindowKernel {
    match k {
        C => WindowKernel::Classic,
        F => WindowKernel::Flash,
        S => WindowKernel::Split,
        P => WindowKernel::PrefillFlash,
        _ => WindowKernel::ThreePass,
    }
}

/// Encodes f32 rows of `stride` into the region bytes of `kv`, replacing each value with the
/// one the device will read (f16 rounding, q8_0 quantization by the CPU quantizer).
pub(super) fn encode_rows(kv: KvType, x: &mut [f32], stride: usize) -> Vec<u8> {
    match kv {
        KvType::F32 => f32_bytes(x),
        KvType::F16 => x
            .iter_mut()
            .flat_map(|val| {
                let h = half::f16::from_f32(*val);
                *val = h.to_f32();
                h.to_le_bytes()
            })
            .collect(),
        KvType::Q8_0 => {
            let rb = launch::q8_0_row_bytes(stride);
            let mut out = vec![0u8; x.len() / stride * rb];
            for (row, dst) in x.chunks_mut(stride).zip(out.chunks_mut(rb)) {
                let packed = &mut dst[..stride / 32 * 34];
                if quantize_row(GgmlType::Q8_0, row, packed).is_ok() {
                    let _ = dequantize_row(GgmlType::Q8_0, packed, row);
                }
            }
            out
        }
    }
}

/// The window buffer of per-query runs `(cell, len)`: a span takes the one run (none: the
/// empty span `[0, 0)`); a kv map puts the runs at the even slots and zero-length runs with
/// out-of-region cells at the odd ones (they must be skipped, not read).
pub(super) fn window_values(kind: WindowKind, runs: &[Vec<(i32, i32)>]) -> Vec<i32> {
    let mut out = Vec::new();
    for r in runs {
        match kind {
            WindowKind::Span => {
                let (lo, len) = r.first().copied().unwrap_or((0, 0));
                out.extend([lo, lo + len]);
            }
            WindowKind::Map => {
                let mut slots = [(0i32, 0i32); 8];
                for (i, s) in slots.iter_mut().enumerate() {
                    *s = (if i % 2 == 0 { -7 } else { 99_999 }, 0);
                }
                for (i, &run) in r.iter().enumerate() {
                    slots[if r.len() <= 4 { 2 * i } else { i }] = run;
                }
                out.extend(slots.iter().flat_map(|&(c, l)| [c, l]));
            }
        }
    }
    out
}

pub(super) fn cells_of(runs: &[Vec<(i32, i32)>]) -> Vec<Vec<usize>> {
    runs.iter()
        .map(|r| {
            r.iter()
                .flat_map(|&(c, l)| c as usize..(c + l) as usize)
                .collect()
        })
        .collect()
}

/// Per query its runs `(cell, len)` in logical order.
pub(super) type Runs = Vec<Vec<(i32, i32)>>;
/// A row placed before upload: cell, K bytes, V bytes, K values, V values.
pub(super) type Placed<'a> = (usize, &'a [u8], &'a [u8], &'a [f32], &'a [f32]);

pub(super) struct Case<B> {
    pub s: WindowAttn,
    pub q: B,
    pub k: B,
    pub v: B,
    pub win: B,
    pub out: B,
    pub want: Vec<f64>,
}

/// A launch over regions of `n_cells` random rows with the given windows and queries
/// (`q` None: random); `place` puts raw rows (k bytes, v bytes) at cells before upload.
#[allow(clippy::too_many_arguments)]
pub(super) fn build<D: Device>(
    dev: &D,
    kv: KvType,
    hd: usize,
    n_cells: usize,
    kind: WindowKind,
    runs: &[Vec<(i32, i32)>],
    q: Option<Vec<f32>>,
    place: &[Placed<'_>],
    seed: u64,
) -> Result<Case<D::Buffer>, String> {
    let scale = 0.7 / (hd as f32).sqrt();
    build_heads(
        dev,
        (NH, NKV),
        scale,
        kv,
        hd,
        n_cells,
        kind,
        runs,
        q,
        place,
        seed,
    )
}

/// [`build`] with `(n_head, n_head_kv)` heads and a score scale.
#[allow(clippy::too_many_arguments)]
fn build_heads<D: Device>(
    dev: &D,
    (nh, nkv): (usize, usize),
    scale: f32,
    kv: KvType,
    hd: usize,
    n_cells: usize,
    kind: WindowKind,
    runs: &[Vec<(i32, i32)>],
    q: Option<Vec<f32>>,
    place: &[Placed<'_>],
    seed: u64,
) -> Result<Case<D::Buffer>, String> {
    let stride = nkv * hd;
    let nt = runs.len();
    let mut r = Rng::new(seed);
    let q = q.unwrap_or_else(|| r.vec(nt * nh * hd));
    let mut k = r.vec(n_cells * stride);
    let mut v = r.vec(n_cells * stride);
    let mut kb = encode_rows(kv, &mut k, stride);
    let mut vb = encode_rows(kv, &mut v, stride);
    let rb = kb.len() / n_cells;
    for &(cell, kr, vr, kf, vf) in place {
        kb[cell * rb..(cell + 1) * rb].copy_from_slice(kr);
        vb[cell * rb..(cell + 1) * rb].copy_from_slice(vr);
        k[cell * stride..(cell + 1) * stride].copy_from_slice(kf);
        v[cell * stride..(cell + 1) * stride].copy_from_slice(vf);
    }
    let want = refr::window_attention(&q, &k, &v, &cells_of(runs), nh, nkv, hd, scale);
    Ok(Case {
        s: WindowAttn {
            n_head: nh,
            n_head_kv: nkv,
            head_dim: hd,
            n_tokens: nt,
            n_cells,
            kv,
            scale,
            window: kind,
        },
        q: dev.buffer_from(&f32_bytes(&q)).map_err(e)?,
        k: dev.buffer_from(&kb).map_err(e)?,
        v: dev.buffer_from(&vb).map_err(e)?,
        win: dev
            .buffer_from(&i32_bytes(&window_values(kind, runs)))
            .map_err(e)?,
        out: dev.new_buffer(nt * nh * hd * 4).map_err(e)?,
        want,
    })
}

pub(super) fn run<D: Device>(
    dev: &D,
    kernel: WindowKernel,
    c: &Case<D::Buffer>,
) -> Result<Vec<f32>, String> {
    let max_len = launch::check_windows(dev, &c.s, &c.win).map_err(e)?;
    let bytes = launch::window_family_scratch_bytes(kernel, &c.s, max_len);
    let scratch = dev.new_buffer(bytes.max(4)).map_err(e)?;
    launch::launch_attention_window_with(
        dev, kernel, &c.s, &c.q, &c.k, &c.v, &c.win, &scratch, &c.out,
    )
    .map_err(e)?;
    read_f32(dev, &c.out, c.s.n_tokens * c.s.n_head * c.s.head_dim)
}

/// Window lengths of the 13-query cases: the KV tails, windows crossing the 256-row flash
/// chunk, an empty window and a single row.
pub(super) const LENS: [i32; 13] = [72, 96, 98, 128, 197, 300, 0, 1, 33, 72, 257, 197, 96];

/// Span runs: query t reads `len` cells from `3 + 2t` (never from cell 0).
pub(super) fn span_runs(lens: &[i32]) -> Runs {
    lens.iter()
        .enumerate()
        .map(|(t, &l)| vec![(3 + 2 * t as i32, l)])
        .collect()
}

/// Map runs: query t's window cut into up to 4 runs of at most 130 cells, laid out in
/// descending cell order (logical order is not cell order), each run in its own 140-cell slot.
pub(super) fn map_runs(lens: &[i32]) -> Runs {
    lens.iter()
        .enumerate()
        .map(|(t, &l)| {
            if l == 0 {
                return Vec::new();
            }
            let k = (1 + t as i32 % 4).max((l + 129) / 130).min(l);
            (0..k)
                .map(|r| {
                    let len = if r == k - 1 {
                        l - (k - 1) * (l / k)
                    } else {
                        l / k
                    };
                    ((k - 1 - r) * 140 + 1 + t as i32 % 5, len)
                })
                .collect()
        })
        .collect()
}

/// Lengths of sequence A in [`sequences`]: every KV tail, one query past each.
pub(super) const SEQ_A: [i32; 12] = [72, 73, 80, 96, 97, 98, 110, 128, 129, 150, 197, 198];
/// Lengths of sequence B in [`sequences`].
pub(super) const SEQ_B: [i32; 5] = [96, 98, 128, 150, 197];

/// Two sequences of a batch whose queries share their mapping (what prefill-flash tiles
/// group): A, a span from cell 9 per query; B, a kv map of a shared prefix (cells 400..430
/// and the adjacent 430..440, two runs of one mapping) and a private run from cell 100.
/// Over 460 cells.
pub(super) fn sequences() -> (Runs, Runs) {
    let a = SEQ_A.iter().map(|&l| vec![(9, l)]).collect();
    let b = SEQ_B
        .iter()
        .map(|&l| vec![(400, 30), (430, 10), (100, l - 40)])
        .collect();
    (a, b)
}

pub(super) fn vs_ref<D: Device, const K: u8, const KV: u8, const HD: usize>(dev: &D) -> GateResult {
    let kv = kv_of(KV);
    let seed = 100 + HD as u64 + 10 * KV as u64 + K as u64;
    let (seq_a, seq_b) = sequences();
    let cases: [(WindowKind, Runs, usize); 6] = [
        (WindowKind::Span, span_runs(&LENS), 330),
        (WindowKind::Map, map_runs(&LENS), 570),
        (WindowKind::Span, vec![vec![(11, 197)]], 215),
        (WindowKind::Map, map_runs(&[0, 0, 197])[2..].to_vec(), 430),
        (WindowKind::Span, seq_a, 460),
        (WindowKind::Map, seq_b, 460),
    ];
    let mut out = Vec::new();
    let mut worst = 0.0f64;
    for (i, (kind, runs, n_cells)) in cases.iter().enumerate() {
        let c = build(
            dev,
            kv,
            HD,
            *n_cells,
            *kind,
            runs,
            None,
            &[],
            seed + i as u64,
        )?;
        let got = run(dev, kernel_of(K), &c)?;
        let err = max_err(&got, &c.want, |_| 1.0);
        if err > TOL {
            return Err(format!(
                "{kind:?} windows, {} queries: max error {err:.3e} exceeds {TOL:.1e}",
                runs.len()
            ));
        }
        worst = worst.max(err);
        out.extend(f32_bytes(&got));
    }
    judge("window attention", out, worst, TOL)
}

fn flash_vs_classic<D: Device>(dev: &D) -> GateResult {
    let mut out = Vec::new();
    let mut worst = 0.0f64;
    for (kv, hd, kind, runs, n_cells) in [
        (KvType::F32, 64, WindowKind::Span, span_runs(&LENS), 330),
        (KvType::F16, 128, WindowKind::Map, map_runs(&LENS), 570),
    ] {
        let c = build(dev, kv, hd, n_cells, kind, &runs, None, &[], 7 + hd as u64)?;
        let flash = run(dev, WindowKernel::Flash, &c)?;
        let classic = run(dev, WindowKernel::Classic, &c)?;
        let classic64: Vec<f64> = classic.iter().map(|&x| x as f64).collect();
        worst = worst.max(max_err(&flash, &classic64, |_| 1.0));
        out.extend(f32_bytes(&flash));
    }
    judge("window flash vs classic", out, worst, TOL_KERNELS)
}

fn refuses<D: Device>(dev: &D) -> GateResult {
    let n_cells = 50;
    let ok_runs = vec![vec![(0, 10)], vec![(5, 20)], vec![(40, 10), (0, 5)]];
    let c = build(
        dev,
        KvType::F32,
        64,
        n_cells,
        WindowKind::Map,
        &ok_runs,
        None,
        &[],
        9,
    )?;
    // control: the in-bounds windows are accepted
    let got = run(dev, WindowKernel::Flash, &c).map_err(|m| format!("control refused: {m}"))?;
    let mut msgs = Vec::new();
    let bad: [(WindowKind, Runs, &str); 4] = [
        (
            WindowKind::Map,
            vec![vec![(0, 10)], vec![(5, 20)], vec![(1, 5), (47, 5)]],
            "query 2: kv map run 2",
        ),
        (
            WindowKind::Map,
            vec![vec![(0, 10)], vec![(-1, 3)], vec![]],
            "query 1: kv map run 0",
        ),
        (
            WindowKind::Span,
            vec![vec![(0, 10)], vec![(45, 6)], vec![]],
            "query 1: span",
        ),
        (
            WindowKind::Map,
            vec![vec![(0, -2)], vec![], vec![]],
            "query 0: kv map run 0 has negative length",
        ),
    ];
    for (kind, runs, want) in bad {
        let mut s = c.s;
        s.window = kind;
        let win = dev
            .buffer_from(&i32_bytes(&window_values(kind, &runs)))
            .map_err(e)?;
        let scratch = dev.new_buffer(1 << 16).map_err(e)?;
        for kernel in [WindowKernel::Flash, WindowKernel::Classic] {
            let msg = match launch::launch_attention_window_with(
                dev, kernel, &s, &c.q, &c.k, &c.v, &win, &scratch, &c.out,
            ) {
                Err(err) => err.to_string(),
                Ok(()) => return Err(format!("{kind:?} {runs:?} was accepted")),
            };
            if !msg.contains(want) {
                return Err(format!("refusal does not name `{want}`: {msg}"));
            }
            msgs.push(msg);
        }
    }
    // flash refuses a packed region by name
    let mut s = c.s;
    s.kv = KvType::Q8_0;
    match launch::launch_attention_window_with(
        dev,
        WindowKernel::Flash,
        &s,
        &c.q,
        &c.k,
        &c.v,
        &c.win,
        &c.q,
        &c.out,
    ) {
        Err(crate::Error::UnsupportedType { ty, .. }) if ty.contains("q8_0") => {}
        other => return Err(format!("flash over q8_0 was not refused: {other:?}")),
    }
    let err = max_err(&got, &c.want, |_| 1.0);
    let mut output = f32_bytes(&got);
    output.extend(msgs.join("\n").into_bytes());
    judge("window refusal", output, err, TOL)
}

/// A launch whose every window is empty writes zeros over whatever `out` held (both kernels,
/// both layouts); control: the same launch with one non-empty window writes non-zeros there.
fn empty<D: Device>(dev: &D) -> GateResult {
    let mut out = Vec::new();
    for (kind, kernel) in [
        (WindowKind::Span, WindowKernel::Flash),
        (WindowKind::Map, WindowKernel::Classic),
        (WindowKind::Map, WindowKernel::Flash),
    ] {
        for live in [false, true] {
            let runs: Runs = vec![vec![], if live { vec![(2, 3)] } else { vec![] }];
            let c = build(dev, KvType::F32, 64, 8, kind, &runs, None, &[], 21)?;
            dev.write_bytes(&c.out, 0, &f32_bytes(&vec![f32::NAN; 2 * NH * 64]))
                .map_err(e)?;
            let got = run(dev, kernel, &c)?;
            let zeros = got.iter().filter(|v| v.to_bits() == 0).count();
            let want = if live { NH * 64 } else { 2 * NH * 64 };
            if zeros != want {
                return Err(format!(
                    "{kind:?} {kernel:?} (live window {live}): {zeros} zero outputs, not {want}"
                ));
            }
            out.extend(f32_bytes(&got));
        }
    }
    judge("empty windows", out, 0.0, 0.0)
}

/// Head shapes the other gates do not reach: head dims 1, 2 and 512 (classic's range ends),
/// no GQA, one KV head for many, q8_0 heads of three blocks, flash without GQA; scores scaled
/// by 4 (peaked softmax weights: the running max moves by several units between blocks).
fn head_shapes<D: Device>(dev: &D) -> GateResult {
    let shapes = [
        (WindowKernel::Classic, KvType::F32, 1, (3, 3)),
        (WindowKernel::Classic, KvType::F16, 2, (4, 1)),
        (WindowKernel::Classic, KvType::F32, 512, (2, 1)),
        (WindowKernel::Classic, KvType::Q8_0, 96, (6, 2)),
        (WindowKernel::Flash, KvType::F16, 128, (8, 8)),
        (WindowKernel::Flash, KvType::F32, 64, (6, 1)),
    ];
    let mut out = Vec::new();
    let mut worst = 0.0f64;
    for (i, (kernel, kv, hd, heads)) in shapes.into_iter().enumerate() {
        let runs = map_runs(&[40, 0, 97]);
        let c = build_heads(
            dev,
            heads,
            4.0,
            kv,
            hd,
            430,
            WindowKind::Map,
            &runs,
            None,
            &[],
            40 + i as u64,
        )?;
        let got = run(dev, kernel, &c)?;
        let err = max_err(&got, &c.want, |_| 1.0);
        if err > TOL_HEAD_SHAPES {
            return Err(format!(
                "{kernel:?} {kv:?} hd{hd} heads {heads:?}: max error {err:.3e} exceeds {TOL_HEAD_SHAPES:.1e}"
            ));
        }
        worst = worst.max(err);
        out.extend(f32_bytes(&got));
    }
    judge("window head shapes", out, worst, TOL_HEAD_SHAPES)
}
