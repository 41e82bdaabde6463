//! Gates of the windowed families past classic and flash (KV-split two-pass, flash prefill
//! with the tail pad, three-pass), each alone against the f64 reference and for batch
//! invariance; the prefill tail gate with its double-count control; the §4.4.1 choice. The
//! stale-tail gates are in conformance/index_tails.rs.

use super::window::{build, run, sequences, vs_ref, window_values, Runs, NH, NKV, P, S, T, TOL};
use super::{e, f32_bytes, judge, max_err, read_f32, GateFn, GateResult};
use crate::device::Device;
use crate::launch::{self, AttnEnv, KvType, WindowAttn, WindowKernel, WindowKind};
use minfer_graph::RowClass;

pub fn register<D: Device>(v: &mut Vec<(String, GateFn<D>)>) {
    let list: [(&str, GateFn<D>); 18] = [
        (
            "window_split_f32_hd64_matches_reference",
            vs_ref::<D, S, 0, 64>,
        ),
        (
            "window_split_f32_hd128_matches_reference",
            vs_ref::<D, S, 0, 128>,
        ),
        (
            "window_split_f16_hd64_matches_reference",
            vs_ref::<D, S, 1, 64>,
        ),
        (
            "window_split_f16_hd128_matches_reference",
            vs_ref::<D, S, 1, 128>,
        ),
        (
            "window_prefill_flash_f32_hd64_matches_reference",
            vs_ref::<D, P, 0, 64>,
        ),
        (
            "window_prefill_flash_f32_hd128_matches_reference",
            vs_ref::<D, P, 0, 128>,
        ),
        (
            "window_prefill_flash_f16_hd64_matches_reference",
            vs_ref::<D, P, 1, 64>,
        ),
        (
            "window_prefill_flash_f16_hd128_matches_reference",
            vs_ref::<D, P, 1, 128>,
        ),
        (
            "window_three_pass_f32_hd64_matches_reference",
            vs_ref::<D, T, 0, 64>,
        ),
        (
            "window_three_pass_f32_hd128_matches_reference",
            vs_ref::<D, T, 0, 128>,
        ),
        (
            "window_three_pass_f16_hd64_matches_reference",
            vs_ref::<D, T, 1, 64>,
        ),
        (
            "window_three_pass_f16_hd128_matches_reference",
            vs_ref::<D, T, 1, 128>,
        ),
        (
            "window_split_is_batch_invariant",
            super::window_invariance::invariant::<D, S>,
        ),
        (
            "window_prefill_flash_is_batch_invariant",
            super::window_invariance::invariant::<D, P>,
        ),
        (
            "window_three_pass_is_batch_invariant",
            super::window_invariance::invariant::<D, T>,
        ),
        (
            "window_prefill_flash_matches_the_reference_at_every_kv_tail",
            prefill_tails::<D>,
        ),
        (
            "window_prefill_flash_tail_overlap_bug_is_caught",
            prefill_tail_bug_is_caught::<D>,
        ),
        (
            "window_kernel_choice_follows_the_dispatch_rules",
            kernel_choice::<D>,
        ),
    ];
    v.extend(list.into_iter().map(|(n, f)| (n.to_string(), f)));
}

const TAILS: [i32; 5] = [72, 96, 98, 128, 197];

/// A whole prefill of `n` queries as a batch sees it: query t attends the first t + 1 rows of
/// its sequence's window (span from cell 5, or a kv map: shared run 300..340, then cells
/// from 20), over 560 cells.
fn causal(kind: WindowKind, n: i32) -> Runs {
    (1..=n)
        .map(|l| match kind {
            WindowKind::Span => vec![(5, l)],
            WindowKind::Map if l <= 40 => vec![(300, l)],
            WindowKind::Map => vec![(300, 40), (20, l - 40)],
        })
        .collect()
}

/// The tail cases: f32 hd64 spans at every KV tail and f16 hd128 maps at 98 and 197.
fn tail_cases() -> Vec<(KvType, usize, WindowKind, i32)> {
    let mut v: Vec<_> = TAILS
        .iter()
        .map(|&n| (KvType::F32, 64, WindowKind::Span, n))
        .collect();
    v.push((KvType::F16, 128, WindowKind::Map, 98));
    v.push((KvType::F16, 128, WindowKind::Map, 197));
    v
}

/// Every query tile meets a partial last block (leader lengths 8, 16, ..., n): the design's
/// #314 KV-tail gate over windows, plus 150 one-query tiles (three waves of tiles). Also pins
/// the host's tile grouping: one sequence tiles by 8 with the longest as leader; sequences
/// never share a tile.
fn prefill_tails<D: Device>(dev: &D) -> GateResult {
    let (a, b) = sequences();
    let tiles =
        |kind, runs: &Runs| launch::prefill_tiles(kind, &window_values(kind, runs), runs.len());
    let want_a = vec![[0, 8, 7, 0], [8, 4, 11, 0]];
    if tiles(WindowKind::Span, &a) != want_a {
        return Err(format!(
            "sequence A tiles {:?}, not {want_a:?}",
            tiles(WindowKind::Span, &a)
        ));
    }
    if tiles(WindowKind::Map, &b) != vec![[0, 5, 4, 0]] {
        return Err(format!("sequence B tiles {:?}", tiles(WindowKind::Map, &b)));
    }
    let two: Runs = vec![vec![(9, 72)], vec![(9, 80)], vec![(10, 72)], vec![(10, 5)]];
    let want_two = vec![[0, 2, 1, 0], [2, 2, 2, 0]];
    if tiles(WindowKind::Span, &two) != want_two {
        return Err(format!(
            "two sequences tiled {:?}, not {want_two:?}",
            tiles(WindowKind::Span, &two)
        ));
    }
    let mut out = Vec::new();
    let mut worst = 0.0f64;
    for (kv, hd, kind, n) in tail_cases() {
        let c = build(
            dev,
            kv,
            hd,
            560,
            kind,
            &causal(kind, n),
            None,
            &[],
            70 + n as u64,
        )?;
        let got = run(dev, WindowKernel::PrefillFlash, &c)?;
        let err = max_err(&got, &c.want, |_| 1.0);
        if err > TOL {
            return Err(format!(
                "{kv:?} hd{hd} {kind:?} n_kv {n}: max error {err:.3e} exceeds {TOL:.1e}"
            ));
        }
        worst = worst.max(err);
        out.extend(f32_bytes(&got));
    }
    // 150 one-query sequences (150 tiles: three waves reusing the pad slots), leader lengths
    // 72 / 98 / 197 / 128 in turn, from cells t (f16 hd64)
    let many: Runs = (0..150)
        .map(|t| vec![(t, [72, 98, 197, 128][t as usize % 4])])
        .collect();
    if tiles(WindowKind::Span, &many).len() != 150 {
        return Err("150 sequences did not give 150 tiles".into());
    }
    let c = build(
        dev,
        KvType::F16,
        64,
        350,
        WindowKind::Span,
        &many,
        None,
        &[],
        71,
    )?;
    let got = run(dev, WindowKernel::PrefillFlash, &c)?;
    let err = max_err(&got, &c.want, |_| 1.0);
    if err > TOL {
        return Err(format!(
            "150 one-query tiles: max error {err:.3e} exceeds {TOL:.1e}"
        ));
    }
    worst = worst.max(err);
    out.extend(f32_bytes(&got));
    judge("window prefill flash tails", out, worst, TOL)
}

/// Control for `prefill_tails`: the tail pad reading the leader's last 64 rows (the seed's
/// recorded bug) double-counts the overlap and must fail the bar in every case.
fn prefill_tail_bug_is_caught<D: Device>(dev: &D) -> GateResult {
    let mut smallest = f64::INFINITY;
    for (kv, hd, kind, n) in tail_cases() {
        let c = build(
            dev,
            kv,
            hd,
            560,
            kind,
            &causal(kind, n),
            None,
            &[],
            70 + n as u64,
        )?;
        let bytes = launch::window_family_scratch_bytes(WindowKernel::PrefillFlash, &c.s, 0);
        let scratch = dev.new_buffer(bytes).map_err(e)?;
        launch::launch_window_prefill_with_tail_bug(
            dev, &c.s, &c.q, &c.k, &c.v, &c.win, &scratch, &c.out,
        )
        .map_err(e)?;
        let got = read_f32(dev, &c.out, c.want.len())?;
        let err = max_err(&got, &c.want, |_| 1.0);
        if err <= TOL {
            return Err(format!(
                "{kv:?} hd{hd} {kind:?} n_kv {n}: the overlapping tail went unseen, error \
                 {err:.3e}"
            ));
        }
        smallest = smallest.min(err);
    }
    // Passing here means the bug was seen: report the smallest bug error as the "output".
    judge(
        "window tail overlap bug",
        f32_bytes(&[smallest as f32]),
        0.0,
        0.0,
    )
}

fn shape_of(n_tokens: usize, head_dim: usize, kv: KvType) -> WindowAttn {
    WindowAttn {
        n_head: NH,
        n_head_kv: NKV,
        head_dim,
        n_tokens,
        n_cells: 10,
        kv,
        scale: 1.0,
        window: WindowKind::Span,
    }
}

/// The §4.4.1 table under every switch setting, the scratch each family asks for, and the
/// entry point running the family it names (with exactly the scratch it asked for).
fn kernel_choice<D: Device>(dev: &D) -> GateResult {
    use WindowKernel::{Classic, Flash, PrefillFlash, Split, ThreePass};
    let off = AttnEnv::default();
    let env = |f: fn(&mut AttnEnv)| {
        let mut x = off;
        f(&mut x);
        x
    };
    let no_flash = env(|x| x.no_flash = true);
    let no_fs = env(|x| {
        x.no_flash = true;
        x.no_split = true
    });
    let no_split = env(|x| x.no_split = true);
    let no_pf = env(|x| x.no_prefill_flash = true);
    let no_pm = env(|x| {
        x.no_prefill_flash = true;
        x.no_matmul = true
    });
    let no_matmul = env(|x| x.no_matmul = true);
    let all = env(|x| {
        *x = AttnEnv {
            no_flash: true,
            no_split: true,
            no_prefill_flash: true,
            no_matmul: true,
        }
    });
    let table = [
        (off, 1, 64, KvType::F32, Flash),
        (off, 1, 128, KvType::F16, Flash),
        (off, 3, 64, KvType::F32, PrefillFlash),
        (off, 197, 128, KvType::F16, PrefillFlash),
        (off, 1, 80, KvType::F32, Classic),
        (off, 5, 256, KvType::F16, Classic),
        (off, 1, 64, KvType::Q8_0, Classic),
        (off, 4, 128, KvType::Q8_0, Classic),
        (no_flash, 1, 64, KvType::F32, Split),
        (no_flash, 1, 128, KvType::F16, Split),
        (no_flash, 3, 64, KvType::F32, PrefillFlash),
        (no_flash, 1, 96, KvType::F32, Classic),
        (no_fs, 1, 64, KvType::F32, Classic),
        (no_split, 1, 64, KvType::F32, Flash),
        (no_pf, 3, 64, KvType::F32, ThreePass),
        (no_pf, 2, 128, KvType::F16, ThreePass),
        (no_pf, 1, 64, KvType::F32, Flash),
        (no_pf, 3, 80, KvType::F32, Classic),
        (no_pm, 3, 64, KvType::F32, Classic),
        (no_pm, 1, 64, KvType::F32, Flash),
        (no_matmul, 3, 64, KvType::F32, PrefillFlash),
        (all, 1, 64, KvType::F32, Classic),
        (all, 3, 128, KvType::F16, Classic),
    ];
    for (env, nt, hd, kv, want) in table {
        let got = launch::window_kernel_for(&shape_of(nt, hd, kv), &env);
        if got != want {
            return Err(format!(
                "{env:?} nt {nt} hd{hd} {kv:?}: took {got:?}, not {want:?}"
            ));
        }
    }
    // The executor's choice per row class, under every switch setting of the table: a run
    // of generation rows takes the one-query family and a run of prompt rows the
    // many-query family, whatever the run's length (1, 3, 16).
    for (env, _, hd, kv, _) in table {
        let decode = launch::window_kernel_for(&shape_of(1, hd, kv), &env);
        let prefill = launch::window_kernel_for(&shape_of(3, hd, kv), &env);
        for nt in [1, 3, 16] {
            let s = shape_of(nt, hd, kv);
            let g = launch::window_class_kernel(&s, RowClass::Generation, &env);
            let p = launch::window_class_kernel(&s, RowClass::Prompt, &env);
            if (g, p) != (decode, prefill) {
                return Err(format!(
                    "{env:?} {nt} rows hd{hd} {kv:?}: generation {g:?} / prompt {p:?}, not \
                     {decode:?} / {prefill:?}"
                ));
            }
        }
    }
    if *AttnEnv::get() != AttnEnv::from_env() {
        return Err("the switches read once differ from the environment".into());
    }
    // scratch per family at nt 3, hd 64, f32, windows up to 600
    let s = shape_of(3, 64, KvType::F32);
    let rows = 3 * NH;
    for (k, want) in [
        (Classic, 0),
        (Flash, rows * 3 * 66 * 4),
        (Split, rows * 10 * 66 * 4),
        (ThreePass, rows * 600 * 4),
        (PrefillFlash, 3 * 2 * 64 * NKV * 64 * 4),
    ] {
        let got = launch::window_family_scratch_bytes(k, &s, 600);
        if got != want {
            return Err(format!("{k:?}: scratch {got}, not {want}"));
        }
    }
    // the entry point runs what window_kernel names, for a decode and a prefill
    let mut out = Vec::new();
    let mut worst = 0.0f64;
    for (kind, runs) in [
        (WindowKind::Span, vec![vec![(3, 197)]]),
        (WindowKind::Map, sequences().1),
    ] {
        let c = build(dev, KvType::F32, 64, 460, kind, &runs, None, &[], 4)?;
        let want = launch::window_kernel(&c.s);
        if want != launch::window_kernel_for(&c.s, &AttnEnv::from_env()) {
            return Err(format!("{kind:?}: window_kernel ignores the environment"));
        }
        let max_len = launch::check_windows(dev, &c.s, &c.win).map_err(e)?;
        let bytes = launch::window_scratch_bytes(&c.s, max_len);
        if bytes != launch::window_family_scratch_bytes(want, &c.s, max_len) {
            return Err(format!("{kind:?}: window_scratch_bytes is not {want:?}'s"));
        }
        let scratch = dev.new_buffer(bytes.max(4)).map_err(e)?;
        let k =
            launch::launch_attention_window(dev, &c.s, &c.q, &c.k, &c.v, &c.win, &scratch, &c.out)
                .map_err(e)?;
        if k != want {
            return Err(format!("{kind:?}: ran {k:?}, window_kernel says {want:?}"));
        }
        let got = read_f32(dev, &c.out, c.want.len())?;
        worst = worst.max(max_err(&got, &c.want, |_| 1.0));
        out.extend(f32_bytes(&got));
    }
    judge("window kernel choice", out, worst, TOL)
}
