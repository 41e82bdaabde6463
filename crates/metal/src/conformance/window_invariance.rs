//! The batch-invariance gate of the window attention kernels (see conformance/window.rs).

use super::window::{build, encode_rows, kernel_of, run, C, NH, NKV, TOL};
use super::{f32_bytes, judge, max_err, GateResult, Rng};
use crate::device::Device;
use crate::launch::{KvType, WindowKind};

/// One query row's output launched three ways must have the same bits: alone (span, its rows
/// at cells 4..), as query 2 of 5 in a kv map with its rows split over three runs in another
/// order of cells next to longer windows in a larger region, as query 0 of 3 (span, rows
/// at 611..) next to a window of the whole region, and as query 2 of 6 of one sequence (span
/// from cell 4, the others 5 shorter to 100 longer: one prefill-flash tile whose leader's
/// blocks put the row's partial block in a full block, the region read past the row's
/// window holding other values). Control: one listed K value changed changes the output.
/// Classic: f32 hd80 and q8_0 hd64; every other family: f32 hd64 and f16 hd128.
pub(super) fn invariant<D: Device, const K: u8>(dev: &D) -> GateResult {
    let kernel = kernel_of(K);
    let shapes = if K == C {
        [(KvType::F32, 80), (KvType::Q8_0, 64)]
    } else {
        [(KvType::F32, 64), (KvType::F16, 128)]
    };
    let mut out = Vec::new();
    for (kv, hd) in shapes {
        let stride = NKV * hd;
        // 530 rows: three flash chunks, the last a tail of 18
        const L: usize = 530;
        let mut r = Rng::new(77 + hd as u64);
        let qx = r.vec(NH * hd);
        let mut kf = r.vec(L * stride);
        let mut vf = r.vec(L * stride);
        let kb = encode_rows(kv, &mut kf, stride);
        let vb = encode_rows(kv, &mut vf, stride);
        let rb = kb.len() / L;
        let rows = |cells: &mut dyn Iterator<Item = usize>| {
            cells
                .enumerate()
                .map(|(j, c)| {
                    (
                        c,
                        &kb[j * rb..(j + 1) * rb],
                        &vb[j * rb..(j + 1) * rb],
                        &kf[j * stride..(j + 1) * stride],
                        &vf[j * stride..(j + 1) * stride],
                    )
                })
                .collect::<Vec<_>>()
        };
        let li = L as i32;
        // A: alone, span [4, 4 + L) of a region of L + 10 cells
        let a = build(
            dev,
            kv,
            hd,
            L + 10,
            WindowKind::Span,
            &[vec![(4, li)]],
            Some(qx.clone()),
            &rows(&mut (4..4 + L)),
            1,
        )?;
        let got_a = run(dev, kernel, &a)?;
        // B: query 2 of 5, runs (700, 100), (50, 230), (400, 200) of 1100 cells
        let split: Vec<usize> = (700..800).chain(50..280).chain(400..600).collect();
        let mut qb = Rng::new(5).vec(5 * NH * hd);
        qb[2 * NH * hd..3 * NH * hd].copy_from_slice(&qx);
        let runs_b = vec![
            vec![(0, 1100)],
            vec![(5, 10)],
            vec![(700, 100), (50, 230), (400, 200)],
            vec![],
            vec![(300, 800)],
        ];
        let b = build(
            dev,
            kv,
            hd,
            1100,
            WindowKind::Map,
            &runs_b,
            Some(qb),
            &rows(&mut split.into_iter()),
            2,
        )?;
        let got_b = run(dev, kernel, &b)?;
        // C: query 0 of 3, span [611, 611 + L) of 1200 cells
        let mut qc = Rng::new(6).vec(3 * NH * hd);
        qc[..NH * hd].copy_from_slice(&qx);
        let c = build(
            dev,
            kv,
            hd,
            1200,
            WindowKind::Span,
            &[vec![(611, li)], vec![(0, 1200)], vec![(100, 613)]],
            Some(qc),
            &rows(&mut (611..611 + L)),
            3,
        )?;
        let got_c = run(dev, kernel, &c)?;
        // D: query 2 of 6 of one sequence, spans [4, 4 + L + d) of L + 110 cells
        let mut qd = Rng::new(8).vec(6 * NH * hd);
        qd[2 * NH * hd..3 * NH * hd].copy_from_slice(&qx);
        let runs_d: Vec<Vec<(i32, i32)>> = [-5, 100, 0, 3, -64, 46]
            .iter()
            .map(|d| vec![(4, li + d)])
            .collect();
        let d = build(
            dev,
            kv,
            hd,
            L + 110,
            WindowKind::Span,
            &runs_d,
            Some(qd),
            &rows(&mut (4..4 + L)),
            4,
        )?;
        let got_d = run(dev, kernel, &d)?;
        let row = NH * hd;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        if bits(&got_a) != bits(&got_b[2 * row..3 * row]) {
            return Err(format!(
                "{kv:?} hd{hd}: the row differs as query 2 of 5 over a kv map"
            ));
        }
        if bits(&got_a) != bits(&got_d[2 * row..3 * row]) {
            return Err(format!(
                "{kv:?} hd{hd}: the row differs as query 2 of 6 of one sequence"
            ));
        }
        if bits(&got_a) != bits(&got_c[..row]) {
            return Err(format!(
                "{kv:?} hd{hd}: the row differs as query 0 of 3 at other cells"
            ));
        }
        let err = max_err(&got_a, &a.want, |_| 1.0);
        if err > TOL {
            return Err(format!(
                "{kv:?} hd{hd}: max error {err:.3e} vs the reference"
            ));
        }
        // control: one listed K value (logical row 300, KV head 0) changed
        let mut kf2 = kf.clone();
        kf2[300 * stride] += 0.5;
        let kb2 = encode_rows(kv, &mut kf2, stride);
        let mut placed = rows(&mut (4..4 + L));
        placed[300].1 = &kb2[300 * rb..301 * rb];
        placed[300].3 = &kf2[300 * stride..301 * stride];
        let a2 = build(
            dev,
            kv,
            hd,
            L + 10,
            WindowKind::Span,
            &[vec![(4, li)]],
            Some(qx.clone()),
            &placed,
            1,
        )?;
        let got_a2 = run(dev, kernel, &a2)?;
        if bits(&got_a2) == bits(&got_a) {
            return Err(format!(
                "{kv:?} hd{hd}: control: changing a listed K value left the output unchanged"
            ));
        }
        out.extend(f32_bytes(&got_a));
    }
    judge("window batch invariance", out, 0.0, 0.0)
}
