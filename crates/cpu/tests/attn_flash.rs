//! Gate: the flash attention kernel against exact attention computed here in f64 from the
//! stored K/V values, on random inputs, for f32 / f16 / q8_0 KV, both row-kernel sets
//! (portable and, where the CPU has it, AVX2+FMA), GQA groups, head dims 64 and 128, and spans
//! that are empty, partial, shifted per token (multi-sequence windows) and longer than one
//! softmax window (so the window merge runs).
//!
//! Tolerance, named before measuring: the kernel is a different float order from exact
//! attention (online softmax rescaling its f32 accumulator as the running max grows, per-window
//! states merged, V summed in f32 FMA lanes; scores are f64), so its error is f32 rounding of
//! those sums: relative ~1e-7 of the largest |V| in the span. The KV storage rounding (f16,
//! q8_0) is not in it: the f64 reference reads the same stored bytes. Asserted at `REL_TOL` =
//! 2e-6; measured (printed with `--nocapture`): at most 2.4e-7 over all cases, portable and
//! AVX2 (with f32 scores it was 6.2e-7, and 9e-6 with inputs 6x larger).
//! Controls (tried by hand, each fails): leaving out the accumulator rescale when the running
//! max grows (`acc *= alpha` in `ops/attn/flash.rs`) fails the GQA prefill, span and decode
//! cases (errors 0.2 to 1.1); merging a later window with weight 1 instead of
//! `exp(part.m - m)` fails the long-context case only (7e-2); reading KV head
//! `g * group % n_head_kv` instead of `g` fails the 4/2x128 decode case (0.22).
use minfer_cpu::ops::attn::{self, AttnParams, WINDOW};
use minfer_cpu::simd::{self, Isa};
use minfer_gguf::quants;
use minfer_gguf::GgmlType;
use minfer_testkit::rng::floats;

const REL_TOL: f64 = 2e-6;

fn i32_slot(v: i32) -> f32 {
    f32::from_bits(v as u32)
}

/// One random attention problem with K/V regions as the backend holds them.
struct Case {
    n_head: usize,
    n_head_kv: usize,
    hd: usize,
    ty: GgmlType,
    n_ctx: usize,
    q: Vec<f32>,
    spans: Vec<(usize, usize)>,
    /// Regions as f32 words (the backend's buffers are f32, hence aligned).
    k: Vec<f32>,
    v: Vec<f32>,
    k_bytes: usize,
}

impl Case {
    fn new(
        n_head: usize,
        n_head_kv: usize,
        hd: usize,
        ty: GgmlType,
        spans: &[(usize, usize)],
    ) -> Case {
        let n_ctx = spans.iter().map(|s| s.1).max().unwrap_or(1).max(1) + 3;
        let n_embd_kv = n_head_kv * hd;
        let cb = attn::cell_bytes(ty, n_embd_kv).unwrap();
        // Magnitude 2 keys and queries: scores spread over several units, so the running max
        // grows often and the rescale matters.
        let kx: Vec<f32> = floats(n_ctx * n_embd_kv, 3 + hd as u64)
            .iter()
            .map(|x| 2.0 * x)
            .collect();
        let vx = floats(n_ctx * n_embd_kv, 4 + hd as u64);
        let cells: Vec<f32> = (0..n_ctx as i32).map(i32_slot).collect();
        let mut kb = vec![0u8; n_ctx * cb];
        let mut vb = vec![0u8; n_ctx * cb];
        attn::kv_store(ty, &kx, n_embd_kv, &cells, &mut kb).unwrap();
        attn::kv_store(ty, &vx, n_embd_kv, &cells, &mut vb).unwrap();
        let nt = spans.len();
        let q: Vec<f32> = floats(nt * n_head * hd, 5 + nt as u64)
            .iter()
            .map(|x| 2.0 * x)
            .collect();
        Case {
            n_head,
            n_head_kv,
            hd,
            ty,
            n_ctx,
            q,
            spans: spans.to_vec(),
            k: words(&kb),
            v: words(&vb),
            k_bytes: kb.len(),
        }
    }

    fn params(&self) -> AttnParams {
        AttnParams {
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.hd,
            scale: 1.0 / (self.hd as f32).sqrt(),
            cache_type: self.ty,
            llamacpp: None,
        }
    }

    fn span_slots(&self) -> Vec<f32> {
        self.spans
            .iter()
            .flat_map(|&(lo, hi)| [i32_slot(lo as i32), i32_slot(hi as i32)])
            .collect()
    }

    fn run(&self, isa: Isa, threads: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; self.spans.len() * self.n_head * self.hd];
        attn::attention_on(
            isa,
            &self.params(),
            &self.q,
            &self.span_slots(),
            &bytes(&self.k)[..self.k_bytes],
            &bytes(&self.v)[..self.k_bytes],
            &mut out,
            threads,
        )
        .unwrap();
        out
    }

    /// The stored head of `kvh` at cell `c` of a region, dequantized (exact).
    fn head(&self, region: &[f32], c: usize, kvh: usize) -> Vec<f32> {
        let cb = attn::cell_bytes(self.ty, self.n_head_kv * self.hd).unwrap();
        let hb = attn::cell_bytes(self.ty, self.hd).unwrap();
        let off = c * cb + kvh * hb;
        let mut out = vec![0f32; self.hd];
        quants::dequantize_row(self.ty, &bytes(region)[off..off + hb], &mut out).unwrap();
        out
    }

    /// Max over rows of |got - exact| / max |V| over the row's span (0 for empty spans,
    /// where the output must be exactly 0).
    fn max_rel_err(&self, got: &[f32]) -> f64 {
        let (hd, group) = (self.hd, self.n_head / self.n_head_kv);
        let scale = 1.0 / (hd as f64).sqrt();
        let mut worst = 0f64;
        for (t, &(lo, hi)) in self.spans.iter().enumerate() {
            for h in 0..self.n_head {
                let o = &got[(t * self.n_head + h) * hd..][..hd];
                if lo == hi {
                    assert!(o.iter().all(|&x| x == 0.0), "empty span gives zeros");
                    continue;
                }
                let kvh = h / group;
                let q = &self.q[(t * self.n_head + h) * hd..][..hd];
                let keys: Vec<_> = (lo..hi).map(|c| self.head(&self.k, c, kvh)).collect();
                let vals: Vec<_> = (lo..hi).map(|c| self.head(&self.v, c, kvh)).collect();
                let s: Vec<f64> = keys
                    .iter()
                    .map(|kh| {
                        q.iter()
                            .zip(kh)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                let vmax = vals
                    .iter()
                    .flatten()
                    .fold(0f64, |a, &x| a.max((x as f64).abs()));
                for d in 0..hd {
                    let want: f64 = e
                        .iter()
                        .zip(&vals)
                        .map(|(w, vh)| w * vh[d] as f64)
                        .sum::<f64>()
                        / z;
                    worst = worst.max((o[d] as f64 - want).abs() / vmax);
                }
            }
        }
        worst
    }
}

fn words(b: &[u8]) -> Vec<f32> {
    let mut padded = b.to_vec();
    padded.resize(b.len().div_ceil(4) * 4, 0);
    padded
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// The kernel sets to check: portable always, AVX2 where this CPU has it (with FMA).
fn isas() -> Vec<Isa> {
    let mut v = vec![Isa::Scalar];
    for isa in simd::available() {
        if isa != Isa::Scalar
            && simd::attn::KvKernels::on(isa, GgmlType::F16).is_ok_and(|k| k.isa == isa)
        {
            v.push(isa);
        }
    }
    v
}

/// Spans of a prefill of `n` tokens after `past` cells, causal: token t sees [0, past + t + 1).
fn causal(past: usize, n: usize) -> Vec<(usize, usize)> {
    (0..n).map(|t| (0, past + t + 1)).collect()
}

fn check(label: &str, case: &Case) {
    for isa in isas() {
        let got = case.run(isa, 1);
        let err = case.max_rel_err(&got);
        eprintln!("{label} {} {isa}: max rel err {err:.2e}", case.ty);
        assert!(
            err <= REL_TOL,
            "{label} {} {isa}: {err:.3e} > {REL_TOL}",
            case.ty
        );
        // The split (tasks per window) and the tiling never change a bit.
        for threads in [2, 3, 8] {
            let other = case.run(isa, threads);
            assert!(
                got.iter()
                    .zip(&other)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{label} {} {isa}: threads={threads} changed the result",
                case.ty
            );
        }
    }
}

const TYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0];

#[test]
fn prefill_with_gqa_matches_exact_attention() {
    // The demo model's heads: 14 query heads over 2 KV heads, head_dim 64; 19 tokens after 45
    // cached (tiles of 8 tokens and a partial one).
    for ty in TYPES {
        check(
            "prefill 14/2x64",
            &Case::new(14, 2, 64, ty, &causal(45, 19)),
        );
    }
}

#[test]
fn head_dim_128_and_no_grouping_match_exact_attention() {
    for ty in TYPES {
        check("prefill 4/4x128", &Case::new(4, 4, 128, ty, &causal(7, 11)));
        check("prefill 8/1x128", &Case::new(8, 1, 128, ty, &causal(0, 5)));
    }
}

#[test]
fn empty_partial_and_per_sequence_spans_match_exact_attention() {
    // Two sequences interleaved in one batch, an empty span, a single cell, windows that start
    // and end inside a block.
    let spans = [
        (0, 1),
        (40, 40),
        (3, 37),
        (100, 133),
        (0, 0),
        (31, 33),
        (100, 134),
        (5, 6),
        (64, 65),
        (17, 96),
    ];
    for ty in TYPES {
        check("spans 6/2x64", &Case::new(6, 2, 64, ty, &spans));
    }
}

#[test]
fn long_context_decode_merges_windows_exactly_enough() {
    // One token over more than two windows (decode at depth), split across threads by window;
    // and a span starting inside a window.
    let n = 2 * WINDOW + 77;
    for ty in TYPES {
        check("decode 14/2x64", &Case::new(14, 2, 64, ty, &[(0, n)]));
        check(
            "decode 4/2x128",
            &Case::new(4, 2, 128, ty, &[(WINDOW - 9, n)]),
        );
    }
}

#[test]
fn odd_head_dim_runs_the_tails() {
    // 8-lane loops plus scalar tails (f32/f16 only: q8_0 heads are whole 32-blocks).
    for ty in [GgmlType::F32, GgmlType::F16] {
        check("prefill 3/1x44", &Case::new(3, 1, 44, ty, &causal(30, 6)));
    }
}

#[test]
fn bad_spans_shapes_and_types_are_refused_by_name() {
    let case = Case::new(4, 2, 64, GgmlType::F16, &[(0, 5)]);
    let run = |p: &AttnParams, span: &[f32]| {
        let mut out = vec![0f32; case.n_head * case.hd];
        attn::attention(
            p,
            &case.q,
            span,
            &bytes(&case.k)[..case.k_bytes],
            &bytes(&case.v)[..case.k_bytes],
            &mut out,
            1,
        )
        .map_err(|e| e.0)
    };
    let past = [i32_slot(0), i32_slot(case.n_ctx as i32 + 1)];
    let e = run(&case.params(), &past).unwrap_err();
    assert!(e.contains("outside"), "{e}");
    let backwards = [i32_slot(3), i32_slot(2)];
    assert!(run(&case.params(), &backwards).is_err());
    let mut p = case.params();
    p.n_head_kv = 3;
    let e = run(&p, &[i32_slot(0), i32_slot(1)]).unwrap_err();
    assert!(e.contains("multiple of n_head_kv"), "{e}");
    let mut p = case.params();
    p.cache_type = GgmlType::Q4_0;
    let e = run(&p, &[i32_slot(0), i32_slot(1)]).unwrap_err();
    assert!(e.contains("Q4_0"), "{e}");
}
