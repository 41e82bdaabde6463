//! Gate: attention over windows of runs is batch invariant, bit for bit.
//!
//! The contract (`Op::Attention`): a row's output depends only on its query and the K/V
//! values its window lists, in order. Checked on random K/V values for f32, f16 and q8_0
//! caches, on every native path (`attention`, which picks the kernel, and the flash kernel of
//! each instruction set through `attention_on`) and, where it holds, llama.cpp's arithmetic:
//! (a) placement: the same values at other cells, or split into 1..4 runs in any cell order
//!     with boundaries inside blocks and windows, give the same bits;
//! (b) batch and row count: a row computed alone equals the same row inside batches of 1..16
//!     other rows with random windows at random places in the batch, and a prefill of 512
//!     tokens cut into chunks of 1, 7, 64 or 512 gives the same bits per row;
//! (c) controls, each asserted to differ: the flash kernel blocking at absolute cells on a
//!     shifted placement; the former f16 switch (llama.cpp's one-chunk kernel below 64 rows,
//!     the flash kernel from 64); llama.cpp's numerics, which keep that switch;
//! (d) the kv-map layout with one run equals the span layout bitwise;
//! (e) bad windows are refused with typed errors naming the problem, and the backend's
//!     attention node takes both layouts from buffers sized as the allocator sizes them;
//! (f) KV cell operations: `copy_cells` is `copy_within`, `rope_shift` composes (d1 then d2
//!     within f32 rounding of d1 + d2, and equals RoPE at the shifted position), q8_0 refuses.

use minfer_cpu::llamacpp_x86::LlamaCppX86;
use minfer_cpu::ops::attn::{
    self, AttnParams, Run, Window, WindowError, BLOCK, KV_MAP_RUNS, KV_MAP_WIDTH, WINDOW,
};
use minfer_cpu::ops::kv_cells::{self, KvCellError, ShiftRope};
use minfer_cpu::ops::rope::{rope, RopeParams};
use minfer_cpu::simd::{self, Isa};
use minfer_gguf::{quants, GgmlType};
use minfer_graph::contract::*;
use minfer_graph::RopeStyle;
use minfer_testkit::rng::{floats, Rng};

fn slot(v: usize) -> f32 {
    f32::from_bits(v as u32)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const TYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0];

/// Attention shapes: heads, KV heads, head dim.
#[derive(Clone, Copy)]
struct Shape {
    n_head: usize,
    n_head_kv: usize,
    hd: usize,
}

impl Shape {
    fn row(self) -> usize {
        self.n_head * self.hd
    }
    fn n_embd_kv(self) -> usize {
        self.n_head_kv * self.hd
    }
}

/// A way to run attention: the dispatching entry with some numerics, or the flash kernel of
/// one instruction set.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Native,
    Flash(Isa),
    Ggml(LlamaCppX86),
}

/// The paths that must be batch invariant for `ty`.
fn invariant_paths(ty: GgmlType) -> Vec<Path> {
    let mut v = vec![Path::Native];
    for isa in simd::available() {
        if simd::attn::KvKernels::on(isa, ty).is_ok_and(|k| k.isa == isa) {
            v.push(Path::Flash(isa));
        }
    }
    v
}

/// K and V regions of `n_cells` cells (as the backend holds them: f32 words).
struct Regions {
    ty: GgmlType,
    shape: Shape,
    k: Vec<f32>,
    v: Vec<f32>,
    bytes: usize,
}

impl Regions {
    /// Regions filled with junk values (seeded), to be overwritten where a sequence lives.
    fn new(ty: GgmlType, shape: Shape, n_cells: usize, seed: u64) -> Regions {
        let nk = shape.n_embd_kv();
        let cb = attn::cell_bytes(ty, nk).unwrap();
        let bytes = n_cells * cb;
        let words = bytes.div_ceil(4);
        let mut r = Regions {
            ty,
            shape,
            k: vec![0.0; words],
            v: vec![0.0; words],
            bytes,
        };
        let kx: Vec<f32> = floats(n_cells * nk, seed).iter().map(|x| 3.0 * x).collect();
        let vx = floats(n_cells * nk, seed + 1);
        let cells: Vec<usize> = (0..n_cells).collect();
        r.store(&kx, &vx, &cells);
        r
    }

    /// Stores rows `k`/`v` (`[cells.len()][n_embd_kv]`) at `cells`.
    fn store(&mut self, k: &[f32], v: &[f32], cells: &[usize]) {
        let nk = self.shape.n_embd_kv();
        let slots: Vec<f32> = cells.iter().map(|&c| slot(c)).collect();
        let bytes = self.bytes;
        attn::kv_store(
            self.ty,
            k,
            nk,
            &slots,
            &mut as_bytes_mut(&mut self.k)[..bytes],
        )
        .unwrap();
        attn::kv_store(
            self.ty,
            v,
            nk,
            &slots,
            &mut as_bytes_mut(&mut self.v)[..bytes],
        )
        .unwrap();
    }

    fn params(&self, llamacpp: Option<LlamaCppX86>) -> AttnParams {
        AttnParams {
            n_head: self.shape.n_head,
            n_head_kv: self.shape.n_head_kv,
            head_dim: self.shape.hd,
            scale: 1.0 / (self.shape.hd as f32).sqrt(),
            cache_type: self.ty,
            llamacpp,
        }
    }

    fn try_run(
        &self,
        path: Path,
        q: &[f32],
        window: &[f32],
        threads: usize,
    ) -> Result<Vec<f32>, String> {
        let nt = q.len() / self.shape.row();
        let mut out = vec![f32::NAN; nt * self.shape.row()];
        let (k, v) = (
            &as_bytes(&self.k)[..self.bytes],
            &as_bytes(&self.v)[..self.bytes],
        );
        let r = match path {
            Path::Native => attn::attention(&self.params(None), q, window, k, v, &mut out, threads),
            Path::Ggml(s) => {
                attn::attention(&self.params(Some(s)), q, window, k, v, &mut out, threads)
            }
            Path::Flash(isa) => {
                attn::attention_on(isa, &self.params(None), q, window, k, v, &mut out, threads)
            }
        };
        r.map(|()| out).map_err(|e| e.0)
    }

    fn run(&self, path: Path, q: &[f32], window: &[f32], threads: usize) -> Vec<f32> {
        self.try_run(path, q, window, threads).unwrap()
    }

    /// The flash kernel with blocks at absolute cells (the control).
    fn run_absolute(&self, isa: Isa, q: &[f32], window: &[f32]) -> Vec<f32> {
        let nt = q.len() / self.shape.row();
        let mut out = vec![f32::NAN; nt * self.shape.row()];
        attn::attention_absolute_blocks_control(
            isa,
            &self.params(None),
            q,
            window,
            &as_bytes(&self.k)[..self.bytes],
            &as_bytes(&self.v)[..self.bytes],
            &mut out,
            1,
        )
        .unwrap();
        out
    }
}

fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn as_bytes_mut(v: &mut [f32]) -> &mut [u8] {
    // SAFETY: as above; every bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// The kv-map input of `windows` (each at most KV_MAP_RUNS runs).
fn kv_map(windows: &[Vec<Run>]) -> Vec<f32> {
    let mut out = Vec::new();
    for w in windows {
        assert!(w.len() <= KV_MAP_RUNS);
        for i in 0..KV_MAP_RUNS {
            let r = w.get(i).copied().unwrap_or_default();
            out.extend([slot(r.cell), slot(r.len)]);
        }
    }
    out
}

/// The span input of `[lo, hi)` windows.
fn spans(windows: &[(usize, usize)]) -> Vec<f32> {
    windows
        .iter()
        .flat_map(|&(lo, hi)| [slot(lo), slot(hi)])
        .collect()
}

/// The first `len` cells of a placement (runs covering a sequence in order).
fn prefix(place: &[Run], len: usize) -> Vec<Run> {
    let mut out = Vec::new();
    let mut left = len;
    for r in place {
        if left == 0 {
            break;
        }
        let n = r.len.min(left);
        out.push(Run {
            cell: r.cell,
            len: n,
        });
        left -= n;
    }
    out
}

fn cells_of(place: &[Run]) -> Vec<usize> {
    place.iter().flat_map(|r| r.cell..r.cell + r.len).collect()
}

/// One sequence's K/V values (`len` cells).
struct Sequence {
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Sequence {
    fn new(shape: Shape, len: usize, seed: u64) -> Sequence {
        let nk = shape.n_embd_kv();
        Sequence {
            k: floats(len * nk, seed).iter().map(|x| 3.0 * x).collect(),
            v: floats(len * nk, seed + 7),
        }
    }
}

const SHAPE: Shape = Shape {
    n_head: 6,
    n_head_kv: 2,
    hd: 64,
};

/// Placements of a sequence of `len` cells in a region of `n_cells`: one run at 0, one run
/// shifted (not block aligned), and 2..4 runs in scrambled cell order with boundaries inside
/// blocks and across windows.
fn placements(len: usize) -> Vec<Vec<Run>> {
    let cut = |points: &[usize], cells: &[usize]| -> Vec<Run> {
        let mut out = Vec::new();
        let mut start = 0;
        for (i, &c) in cells.iter().enumerate() {
            let end = points.get(i).copied().unwrap_or(len).min(len);
            if end > start {
                out.push(Run {
                    cell: c,
                    len: end - start,
                });
            }
            start = end;
        }
        out
    };
    let n_cells = region_cells(len);
    let a = len / 3 + 5;
    let b = (2 * len) / 3 + 1;
    let c = len - 3;
    vec![
        vec![Run { cell: 0, len }],
        vec![Run { cell: 300, len }],
        vec![Run { cell: 17, len }],
        cut(&[a], &[n_cells - (len - a), 5]),
        cut(&[a, b], &[2 * len + 40, 11, len + 20]),
        cut(&[7, a, c], &[3 * len + 150, len + 9, 2 * len + 60, 2]),
    ]
}

fn region_cells(len: usize) -> usize {
    4 * len + 200
}

/// Queries over prefixes of a sequence: lengths `len`, `len - 1`, a partial block, one cell.
fn prefix_lens(len: usize) -> Vec<usize> {
    vec![len, len - 1, len / 2 + 3, 1]
}

#[test]
fn a_placement_does_not_change_bits() {
    for len in [45, 70, WINDOW + 2 * BLOCK + 9, 2 * WINDOW + 77] {
        for ty in TYPES {
            let seq = Sequence::new(SHAPE, len, 11 + len as u64);
            let lens = prefix_lens(len);
            let q = floats(lens.len() * SHAPE.row(), 3 + len as u64);
            let mut paths = invariant_paths(ty);
            if ty == GgmlType::F16 {
                paths.extend([
                    Path::Ggml(LlamaCppX86::Avx2),
                    Path::Ggml(LlamaCppX86::Avx512),
                ]);
            }
            for path in paths {
                let mut want: Option<Vec<u32>> = None;
                for (pi, place) in placements(len).iter().enumerate() {
                    let mut reg = Regions::new(ty, SHAPE, region_cells(len), 99 + pi as u64);
                    reg.store(&seq.k, &seq.v, &cells_of(place));
                    let windows: Vec<Vec<Run>> = lens.iter().map(|&l| prefix(place, l)).collect();
                    for threads in [1, 2] {
                        let got = bits(&reg.run(path, &q, &kv_map(&windows), threads));
                        match &want {
                            None => want = Some(got),
                            Some(w) => assert!(
                                *w == got,
                                "{ty} {path:?} len {len}: placement {pi} {place:?} threads \
                                 {threads} changed bits"
                            ),
                        }
                    }
                }
            }
        }
    }
}

/// Several sequences in one region, and random rows over prefixes of them.
struct Batch {
    reg: Regions,
    places: Vec<Vec<Run>>,
    lens: Vec<usize>,
}

impl Batch {
    fn new(ty: GgmlType, shape: Shape) -> Batch {
        let lens = vec![40, 700, 131];
        let places = vec![
            vec![Run {
                cell: 1000,
                len: 40,
            }],
            vec![
                Run { cell: 3, len: 200 },
                Run {
                    cell: 1100,
                    len: 333,
                },
                Run {
                    cell: 500,
                    len: 167,
                },
            ],
            vec![
                Run {
                    cell: 219,
                    len: 100,
                },
                Run { cell: 800, len: 31 },
            ],
        ];
        let mut reg = Regions::new(ty, shape, 1600, 5);
        for (s, (&len, place)) in lens.iter().zip(&places).enumerate() {
            let seq = Sequence::new(shape, len, 40 + s as u64);
            reg.store(&seq.k, &seq.v, &cells_of(place));
        }
        Batch { reg, places, lens }
    }

    /// A random row: a sequence and a prefix length.
    fn random_row(&self, rng: &mut Rng) -> Vec<Run> {
        let s = rng.below(self.places.len());
        let l = 1 + rng.below(self.lens[s]);
        prefix(&self.places[s], l)
    }
}

#[test]
fn b_rows_do_not_depend_on_the_batch() {
    let mut rng = Rng::xorshift64_raw(0x2545_f491_4f6c_dd1d);
    for ty in TYPES {
        let b = Batch::new(ty, SHAPE);
        let row = SHAPE.row();
        for path in invariant_paths(ty) {
            for trial in 0..6 {
                let me = b.random_row(&mut rng);
                let my_q = floats(row, 1000 + trial);
                let alone = bits(
                    &b.reg
                        .run(path, &my_q, &kv_map(std::slice::from_ref(&me)), 1),
                );
                for others in [1, 2, 5, 9, 16] {
                    let at = rng.below(others + 1);
                    let mut windows: Vec<Vec<Run>> =
                        (0..others).map(|_| b.random_row(&mut rng)).collect();
                    windows.insert(at, me.clone());
                    let mut q = floats((others + 1) * row, 2000 + trial * 31 + others as u64);
                    q[at * row..(at + 1) * row].copy_from_slice(&my_q);
                    for threads in [1, 2, 3] {
                        let out = b.reg.run(path, &q, &kv_map(&windows), threads);
                        assert!(
                            bits(&out[at * row..(at + 1) * row]) == alone,
                            "{ty} {path:?}: row {me:?} at {at} of {} rows, threads \
                             {threads}, differs from the row alone",
                            others + 1
                        );
                    }
                }
            }
        }
    }
}

/// The rows of a prefill of `n` tokens over a sequence placed at `place`, in chunks of
/// `chunk` rows (one attention call per chunk).
fn prefill(reg: &Regions, path: Path, place: &[Run], q: &[f32], chunk: usize) -> Vec<u32> {
    let row = reg.shape.row();
    let n = q.len() / row;
    let mut out = Vec::with_capacity(q.len());
    for c0 in (0..n).step_by(chunk) {
        let c1 = (c0 + chunk).min(n);
        let windows: Vec<Vec<Run>> = (c0..c1).map(|t| prefix(place, t + 1)).collect();
        out.extend(bits(&reg.run(
            path,
            &q[c0 * row..c1 * row],
            &kv_map(&windows),
            2,
        )));
    }
    out
}

const PREFILL_SHAPE: Shape = Shape {
    n_head: 4,
    n_head_kv: 2,
    hd: 64,
};

#[test]
fn b_prefill_chunking_does_not_change_bits() {
    let n = 512;
    let place = vec![
        Run { cell: 37, len: 300 },
        Run {
            cell: 600,
            len: 212,
        },
    ];
    for ty in TYPES {
        let seq = Sequence::new(PREFILL_SHAPE, n, 77);
        let mut reg = Regions::new(ty, PREFILL_SHAPE, 1000, 8);
        reg.store(&seq.k, &seq.v, &cells_of(&place));
        let q = floats(n * PREFILL_SHAPE.row(), 78);
        for path in invariant_paths(ty) {
            let whole = prefill(&reg, path, &place, &q, 512);
            for chunk in [1, 7, 64] {
                assert!(
                    prefill(&reg, path, &place, &q, chunk) == whole,
                    "{ty} {path:?}: chunks of {chunk} differ from one chunk of 512"
                );
            }
        }
    }
}

#[test]
fn c_controls_differ() {
    // 1. Blocks at absolute cells: the same values at cell 0 and at cell 17 give different
    //    bits (and at cell 0 the control is the kernel itself).
    let len = WINDOW + 77;
    for ty in TYPES {
        let seq = Sequence::new(SHAPE, len, 5);
        let q = floats(3 * SHAPE.row(), 6);
        let isa = simd::detected();
        let mut outs = Vec::new();
        for cell in [0, 17] {
            let mut reg = Regions::new(ty, SHAPE, region_cells(len), 1);
            let place = vec![Run { cell, len }];
            reg.store(&seq.k, &seq.v, &cells_of(&place));
            let windows: Vec<Vec<Run>> = [len, len - 5, 100]
                .iter()
                .map(|&l| prefix(&place, l))
                .collect();
            let map = kv_map(&windows);
            let abs = bits(&reg.run_absolute(isa, &q, &map));
            let logical = bits(&reg.run(Path::Flash(isa), &q, &map, 1));
            if cell == 0 {
                assert_eq!(abs, logical, "{ty}: at cell 0 absolute is logical blocking");
            }
            outs.push((abs, logical));
        }
        assert_eq!(
            outs[0].1, outs[1].1,
            "{ty}: logical blocking is placement-free"
        );
        assert_ne!(
            outs[0].0, outs[1].0,
            "{ty}: control: absolute blocking must change with the placement"
        );
    }
    // 2. The former f16 switch: the one-chunk kernel (native f16, every row count) and the
    //    flash kernel (which served 64 rows and more) round the same row differently.
    let n = 64;
    let place = vec![Run { cell: 0, len: 200 }];
    let seq = Sequence::new(SHAPE, 200, 9);
    let mut reg = Regions::new(GgmlType::F16, SHAPE, 256, 2);
    reg.store(&seq.k, &seq.v, &cells_of(&place));
    let q = floats(n * SHAPE.row(), 10);
    let windows: Vec<Vec<Run>> = (0..n).map(|t| prefix(&place, 137 + t)).collect();
    let map = kv_map(&windows);
    let native = reg.run(Path::Native, &q, &map, 1);
    let flash = reg.run(Path::Flash(simd::detected()), &q, &map, 1);
    assert_ne!(
        bits(&native),
        bits(&flash),
        "control: the former switch changed a row's kernel at 64 rows"
    );
    // 3. llama.cpp's numerics keep the switch: the last row of a 64-row call differs from the
    //    same row in a 63-row call.
    let row = SHAPE.row();
    for simd in [LlamaCppX86::Avx2, LlamaCppX86::Avx512] {
        let full = reg.run(Path::Ggml(simd), &q, &map, 1);
        let short = reg.run(Path::Ggml(simd), &q[row..], &map[KV_MAP_WIDTH..], 1);
        assert_ne!(
            bits(&full[row..]),
            bits(&short),
            "control: llama.cpp's {simd:?} arithmetic switches kernels at 64 rows"
        );
        // Below 64 rows it is row-count independent (one kernel).
        let shorter = reg.run(Path::Ggml(simd), &q[2 * row..], &map[2 * KV_MAP_WIDTH..], 1);
        assert_eq!(bits(&short[row..]), bits(&shorter));
    }
}

#[test]
fn d_one_run_kv_map_equals_span() {
    let ranges = [
        (0, 1),
        (0, 0),
        (3, 37),
        (100, 733),
        (31, 33),
        (5, 5),
        (0, 600),
    ];
    let maps: Vec<Vec<Run>> = ranges
        .iter()
        .map(|&(lo, hi)| {
            if hi > lo {
                vec![Run {
                    cell: lo,
                    len: hi - lo,
                }]
            } else {
                vec![]
            }
        })
        .collect();
    for ty in TYPES {
        let reg = Regions::new(ty, SHAPE, 800, 3);
        let q = floats(ranges.len() * SHAPE.row(), 4);
        let mut paths = invariant_paths(ty);
        if ty == GgmlType::F16 {
            paths.extend([
                Path::Ggml(LlamaCppX86::Avx2),
                Path::Ggml(LlamaCppX86::Avx512),
            ]);
        }
        for path in paths {
            let a = reg.run(path, &q, &spans(&ranges), 2);
            let b = reg.run(path, &q, &kv_map(&maps), 2);
            assert_eq!(bits(&a), bits(&b), "{ty} {path:?}");
            // An unused run between used ones is skipped, too.
            let mut spread = kv_map(&maps);
            for t in 0..ranges.len() {
                spread.swap(t * KV_MAP_WIDTH, t * KV_MAP_WIDTH + 4);
                spread.swap(t * KV_MAP_WIDTH + 1, t * KV_MAP_WIDTH + 5);
            }
            assert_eq!(
                bits(&a),
                bits(&reg.run(path, &q, &spread, 1)),
                "{ty} {path:?}"
            );
            // Empty windows give zeros.
            for (t, &(lo, hi)) in ranges.iter().enumerate() {
                if lo == hi {
                    assert!(a[t * SHAPE.row()..(t + 1) * SHAPE.row()]
                        .iter()
                        .all(|&x| x == 0.0));
                }
            }
        }
    }
}

#[test]
fn e_bad_windows_are_typed_errors() {
    let n_cells = 50;
    let parse = |v: &[i32], nt: usize| {
        let slots: Vec<f32> = v.iter().map(|&x| f32::from_bits(x as u32)).collect();
        attn::parse_windows(&slots, nt, n_cells)
    };
    let map = |runs: &[(i32, i32)]| -> Vec<i32> {
        let mut v: Vec<i32> = runs.iter().flat_map(|&(c, l)| [c, l]).collect();
        v.resize(KV_MAP_WIDTH, 0);
        v
    };
    assert_eq!(
        parse(&[0, 1, 2], 1),
        Err(WindowError::Layout {
            values: 3,
            n_tokens: 1
        })
    );
    assert_eq!(
        parse(&[0, 51], 1),
        Err(WindowError::Span {
            token: 0,
            lo: 0,
            hi: 51,
            n_cells
        })
    );
    assert!(matches!(
        parse(&[0, 1, 4, 3], 2),
        Err(WindowError::Span {
            token: 1,
            lo: 4,
            hi: 3,
            ..
        })
    ));
    assert!(matches!(
        parse(&[-1, 3], 1),
        Err(WindowError::Span { lo: -1, .. })
    ));
    assert_eq!(
        parse(&map(&[(0, 4), (45, 6)]), 1),
        Err(WindowError::RunOutside {
            token: 0,
            run: 1,
            cell: 45,
            len: 6,
            n_cells
        })
    );
    assert!(matches!(
        parse(&map(&[(-2, 4)]), 1),
        Err(WindowError::RunOutside { cell: -2, .. })
    ));
    assert_eq!(
        parse(&map(&[(0, 4), (9, -1)]), 1),
        Err(WindowError::NegativeRun {
            token: 0,
            run: 1,
            len: -1
        })
    );
    let mut two = map(&[(0, 4)]);
    two.extend(map(&[(10, 5), (2, 9), (30, 1)]));
    assert!(matches!(
        parse(&two, 2),
        Err(WindowError::Overlap {
            token: Some(1),
            first: (0, _),
            second: (1, _)
        })
    ));
    let too_many: Vec<Run> = (0..KV_MAP_RUNS + 1)
        .map(|i| Run {
            cell: 10 * i,
            len: 2,
        })
        .collect();
    assert_eq!(
        Window::from_runs(&too_many),
        Err(WindowError::TooManyRuns {
            runs: KV_MAP_RUNS + 1
        })
    );
    // Valid: unused runs anywhere, adjacent runs, runs in any cell order.
    let w = parse(&map(&[(40, 10), (0, 0), (0, 40)]), 1).unwrap();
    assert_eq!(w[0].len(), 50);
    assert_eq!(w[0].cells().next(), Some(40));
    assert_eq!(w[0].cell(10), 0);
    // The kernels report the same problems by name.
    let reg = Regions::new(GgmlType::F16, SHAPE, n_cells, 1);
    let q = floats(SHAPE.row(), 2);
    for path in [
        Path::Native,
        Path::Flash(Isa::Scalar),
        Path::Ggml(LlamaCppX86::Avx2),
    ] {
        let bad = |v: &[i32]| {
            let slots: Vec<f32> = v.iter().map(|&x| f32::from_bits(x as u32)).collect();
            reg.try_run(path, &q, &slots, 1).unwrap_err()
        };
        assert!(bad(&[0, 51]).contains("outside"));
        assert!(bad(&map(&[(45, 6)])).contains("kv map run 0"));
        assert!(bad(&map(&[(0, 4), (3, 1)])).contains("overlap"));
        assert!(bad(&[0, 1, 2]).contains("neither a span"));
    }
}

#[test]
fn f_copy_cells_is_memmove() {
    for cb in [1usize, 6, 34] {
        let n_cells = 9;
        let orig: Vec<u8> = (0..n_cells * cb).map(|i| (i * 7 + 3) as u8).collect();
        for src in 0..n_cells {
            for dst in 0..n_cells {
                for n in 0..=(n_cells - src.max(dst)) {
                    let mut want = orig.clone();
                    want.copy_within(src * cb..(src + n) * cb, dst * cb);
                    let mut got = orig.clone();
                    kv_cells::copy_cells(&mut got, cb, src, dst, n).unwrap();
                    assert_eq!(got, want, "cb {cb} src {src} dst {dst} n {n}");
                }
            }
        }
        let mut r = orig.clone();
        assert!(matches!(
            kv_cells::copy_cells(&mut r, cb, 5, 0, 5),
            Err(KvCellError::OutOfRegion {
                start: 5,
                n: 5,
                n_cells: 9,
                ..
            })
        ));
        assert!(matches!(
            kv_cells::copy_cells(&mut r, cb, 0, 8, 2),
            Err(KvCellError::OutOfRegion { start: 8, .. })
        ));
        assert_eq!(r, orig, "a refused copy changes nothing");
    }
}

/// Rows of `n_cells` cells rotated by `rope` at positions `pos` and stored as `ty`.
fn rotated_region(ty: GgmlType, p: &RopeParams, raw: &[f32], pos: &[usize]) -> (Vec<u8>, Vec<f32>) {
    let nk = p.n_head * p.head_dim;
    let slots: Vec<f32> = pos.iter().map(|&x| slot(x)).collect();
    let mut rot = vec![0f32; raw.len()];
    rope(p, raw, &slots, &mut rot);
    let cb = attn::cell_bytes(ty, nk).unwrap();
    let mut region = vec![0u8; pos.len() * cb];
    let cells: Vec<f32> = (0..pos.len()).map(slot).collect();
    attn::kv_store(ty, &rot, nk, &cells, &mut region).unwrap();
    (region, rot)
}

fn dequant(ty: GgmlType, region: &[u8], nk: usize) -> Vec<f32> {
    let cb = attn::cell_bytes(ty, nk).unwrap();
    let mut out = vec![0f32; region.len() / cb * nk];
    for (src, dst) in region.chunks_exact(cb).zip(out.chunks_exact_mut(nk)) {
        quants::dequantize_row(ty, src, dst).unwrap();
    }
    out
}

#[test]
fn f_rope_shift_composes_and_q8_0_refuses() {
    // Qwen2.5's RoPE (NeoX, base 1e6) and LLaMA's (normal, base 1e4); 2 KV heads of 64.
    let styles = [(RopeStyle::Neox, 1e6f32), (RopeStyle::Normal, 1e4)];
    let (n_kv, hd, n) = (2usize, 64usize, 70usize);
    let nk = n_kv * hd;
    let raw: Vec<f32> = floats(n * nk, 12).iter().map(|x| 4.0 * x).collect();
    let pos: Vec<usize> = (0..n).map(|i| 3 * i + 1).collect();
    let mut worst = [0f64; 2];
    for (style, base) in styles {
        let sr = ShiftRope {
            style,
            freq_base: base,
            freq_scale: 1.0,
            fused: false,
        };
        let p = RopeParams {
            style,
            n_head: n_kv,
            head_dim: hd,
            freq_base: base,
            freq_scale: 1.0,
            fused: false,
        };
        for (ti, ty) in [GgmlType::F32, GgmlType::F16].into_iter().enumerate() {
            for (d1, d2) in [(37i64, -11i64), (-300, 512), (1, 1)] {
                let (mut a, _) = rotated_region(ty, &p, &raw, &pos);
                let mut b = a.clone();
                kv_cells::rope_shift(&mut a, ty, n_kv, hd, &sr, 0, n, d1).unwrap();
                kv_cells::rope_shift(&mut a, ty, n_kv, hd, &sr, 0, n, d2).unwrap();
                kv_cells::rope_shift(&mut b, ty, n_kv, hd, &sr, 0, n, d1 + d2).unwrap();
                // Against a fresh rotation at the shifted positions (positions stay >= 0).
                let shifted: Vec<usize> = pos
                    .iter()
                    .map(|&x| (x as i64 + 300 + d1 + d2) as usize)
                    .collect();
                let (_, fresh) = rotated_region(GgmlType::F32, &p, &raw, &shifted);
                let (mut c, _) = rotated_region(ty, &p, &raw, &pos);
                kv_cells::rope_shift(&mut c, ty, n_kv, hd, &sr, 0, n, 300 + d1 + d2).unwrap();
                let (a, b, c) = (
                    dequant(ty, &a, nk),
                    dequant(ty, &b, nk),
                    dequant(ty, &c, nk),
                );
                for ((x, y), (z, f)) in a.iter().zip(&b).zip(c.iter().zip(&fresh)) {
                    worst[ti] = worst[ti]
                        .max((x - y).abs() as f64)
                        .max((z - f).abs() as f64);
                }
            }
        }
    }
    eprintln!(
        "rope_shift max |err| f32 {:.2e}, f16 {:.2e}",
        worst[0], worst[1]
    );
    // Bound, f32: rotations keep |x| <= 4 * sqrt(2) = 5.7. Pair j's angle is pos * s^j,
    // s = base^(-2/64), formed by j rounded f32 products (the rounding of s itself is common
    // to both sides and cancels): its error is at most |pos| * j * s^j * 2^-24 <= 812 * 1.3 *
    // 6e-8 = 6e-5 rad (|pos| <= 812 here; j * s^j <= 1.3 for both bases), so 3.5e-4 per
    // rotated value and 7e-4 between two ways of composing; asserted at 1e-3 (measured
    // 1.8e-4). f16: each stored value rounds to half once per shift (half an ulp below 8:
    // 2^-9 = 2e-3), three roundings between the sides: 6e-3 plus the f32 part; asserted at
    // 1e-2 (measured 3.9e-3, one ulp).
    assert!(worst[0] < 1e-3, "f32 {}", worst[0]);
    assert!(worst[1] < 1e-2, "f16 {}", worst[1]);
    // q8_0 refuses (and changes nothing); a no-op shift is fine.
    let sr = ShiftRope {
        style: RopeStyle::Neox,
        freq_base: 1e6,
        freq_scale: 1.0,
        fused: false,
    };
    let cb = attn::cell_bytes(GgmlType::Q8_0, nk).unwrap();
    let mut q8 = vec![7u8; 4 * cb];
    let before = q8.clone();
    assert_eq!(
        kv_cells::rope_shift(&mut q8, GgmlType::Q8_0, n_kv, hd, &sr, 0, 4, 3),
        Err(KvCellError::CannotShift { ty: GgmlType::Q8_0 })
    );
    assert_eq!(q8, before);
    assert!(kv_cells::rope_shift(&mut q8, GgmlType::Q8_0, n_kv, hd, &sr, 0, 4, 0).is_ok());
    let mut f = vec![0u8; 4 * nk * 4];
    assert!(matches!(
        kv_cells::rope_shift(&mut f, GgmlType::F32, n_kv, hd, &sr, 2, 3, 1),
        Err(KvCellError::OutOfRegion {
            start: 2,
            n: 3,
            n_cells: 4,
            ..
        })
    ));
    assert_eq!(
        kv_cells::rope_shift(&mut f, GgmlType::F32, n_kv, hd, &sr, 0, 1, 1 << 40),
        Err(KvCellError::DeltaRange { delta: 1 << 40 })
    );
}

/// The row kernels the flash kernel relies on: a list of scattered cells scores and
/// accumulates exactly as the same values stored contiguously; the accumulation called on
/// consecutive pieces of a list, in order, equals one call over the list. Control: scoring
/// pieces separately changes f64 score bits on AVX2 (it reduces 4 list entries together and a
/// piece's last `n % 4` entries in another order), which is why the flash kernel passes each
/// logical block's cells as one list.
#[test]
fn row_kernels_take_lists_of_cells() {
    let hd = 64;
    for ty in TYPES {
        let hb = attn::cell_bytes(ty, hd).unwrap();
        let n = BLOCK;
        // Heads at scattered cells of a 3n-cell region, and the same heads contiguous.
        let vals: Vec<f32> = floats(3 * n * hd, 21).iter().map(|x| 3.0 * x).collect();
        let mut region = vec![0u8; 3 * n * hb];
        for (c, row) in vals.chunks_exact(hd).enumerate() {
            quants::quantize_row(ty, row, &mut region[c * hb..(c + 1) * hb]).unwrap();
        }
        let scattered: Vec<usize> = (0..n).map(|j| ((7 * j + 5) % (3 * n)) * hb).collect();
        let mut packed = vec![0u8; n * hb];
        for (j, &o) in scattered.iter().enumerate() {
            packed[j * hb..(j + 1) * hb].copy_from_slice(&region[o..o + hb]);
        }
        let contiguous: Vec<usize> = (0..n).map(|j| j * hb).collect();
        let q = floats(hd, 22);
        let p: Vec<f32> = floats(n, 23).iter().map(|x| x.abs()).collect();
        for isa in simd::available() {
            let Ok(kern) = simd::attn::KvKernels::on(isa, ty) else {
                continue;
            };
            let mut s1 = vec![0f64; n];
            let mut s2 = vec![0f64; n];
            (kern.scores)(&q, &region, &scattered, &mut s1);
            (kern.scores)(&q, &packed, &contiguous, &mut s2);
            let b64 = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(b64(&s1), b64(&s2), "{ty} {isa}: scores of a list");
            let mut a1 = floats(hd, 24);
            let mut a2 = a1.clone();
            (kern.accum)(&mut a1, &region, &scattered, &p);
            (kern.accum)(&mut a2, &packed, &contiguous, &p);
            assert_eq!(bits(&a1), bits(&a2), "{ty} {isa}: accum of a list");
            for cut in [(1, 2), (3, 10), (5, 31)] {
                let mut pieces = floats(hd, 24);
                for (lo, hi) in [(0, cut.0), (cut.0, cut.1), (cut.1, n)] {
                    (kern.accum)(&mut pieces, &region, &scattered[lo..hi], &p[lo..hi]);
                }
                assert_eq!(
                    bits(&pieces),
                    bits(&a1),
                    "{ty} {isa}: accum in pieces {cut:?}"
                );
            }
        }
    }
    // The control, on values whose f64 sums round (random ones are exact in f64 whatever the
    // order): per cell, lane sums (2^55, 1, -2^55, 1), which the 4-cell reduction adds as
    // (2^55 + 1) + (-2^55 + 1) = 0 and a single cell as (2^55 - 2^55) + (1 + 1) = 2.
    if !simd::attn::KvKernels::on(Isa::Avx2, GgmlType::F32).is_ok_and(|k| k.isa == Isa::Avx2) {
        eprintln!("no AVX2 attention kernels here: control skipped");
        return;
    }
    for ty in [GgmlType::F32, GgmlType::F16] {
        let kern = simd::attn::KvKernels::on(Isa::Avx2, ty).unwrap();
        let hd = 64;
        let hb = attn::cell_bytes(ty, hd).unwrap();
        let n = BLOCK;
        let mut head = vec![0f32; hd];
        head[..4].copy_from_slice(&[32768.0, 1.0, -32768.0, 1.0]);
        let mut region = vec![0u8; n * hb];
        for c in 0..n {
            quants::quantize_row(ty, &head, &mut region[c * hb..(c + 1) * hb]).unwrap();
        }
        let mut q = vec![0f32; hd];
        q[..4].copy_from_slice(&[2f32.powi(40), 1.0, 2f32.powi(40), 1.0]);
        let cells: Vec<usize> = (0..n).map(|j| j * hb).collect();
        let mut whole = vec![0f64; n];
        (kern.scores)(&q, &region, &cells, &mut whole);
        let mut pieces = vec![0f64; n];
        for (lo, hi) in [(0, 3), (3, 10), (10, n)] {
            (kern.scores)(&q, &region, &cells[lo..hi], &mut pieces[lo..hi]);
        }
        assert!(whole.iter().all(|&x| x == 0.0), "{ty}: {whole:?}");
        assert_ne!(whole, pieces, "{ty}: control: pieces regroup the scores");
    }
}

struct NoWeights;
impl minfer_graph::WeightSource for NoWeights {
    fn weight(&self, _: minfer_graph::WeightId) -> Option<minfer_graph::WeightRef<'_>> {
        None
    }
    fn name(&self, _: minfer_graph::WeightId) -> &str {
        "none"
    }
    fn id(&self, _: &str) -> Option<minfer_graph::WeightId> {
        None
    }
    fn len(&self) -> usize {
        0
    }
}

/// The backend's attention node takes both window layouts from buffers sized as the
/// allocator sizes them (size classes), with the same bits as the kernel called directly.
#[test]
fn backend_attention_node_takes_both_layouts() {
    use minfer_cpu::CpuBackend;
    use minfer_graph::{size_class, BufId, DType, ExecArgs, KvPair, Node, NodeId, Op};
    let ty = GgmlType::F16;
    let n_cells = 900;
    let reg = Regions::new(ty, SHAPE, n_cells, 31);
    let row = SHAPE.row();
    let mut rng = Rng::xorshift64_raw(77);
    for nt in [1usize, 2, 3, 5, 64, 300] {
        let q = floats(nt * row, 32 + nt as u64);
        let runs: Vec<Vec<Run>> = (0..nt)
            .map(|_| {
                let (a, b) = (1 + rng.below(200), 1 + rng.below(300));
                vec![Run { cell: 500, len: a }, Run { cell: 7, len: b }]
            })
            .collect();
        let ranges: Vec<(usize, usize)> = (0..nt)
            .map(|_| {
                let lo = rng.below(400);
                (lo, lo + rng.below(400))
            })
            .collect();
        for (window, layout) in [
            (spans(&ranges), minfer_graph::WindowLayout::Span),
            (kv_map(&runs), minfer_graph::WindowLayout::KvMap),
        ] {
            let want = reg.run(Path::Native, &q, &window, 2);
            let mut be = CpuBackend::new(2);
            let put = |be: &mut CpuBackend, data: &[u8]| -> BufId {
                let id = be.alloc(size_class(data.len())).unwrap();
                be.write(id, 0, data).unwrap();
                id
            };
            let qb = put(&mut be, as_bytes(&q));
            let wb = put(&mut be, as_bytes(&window));
            let kb = put(&mut be, as_bytes(&reg.k));
            let vb = put(&mut be, as_bytes(&reg.v));
            let ob = be.alloc(size_class(4 * nt * row)).unwrap();
            let node = Node {
                id: NodeId(2),
                name: "attn".into(),
                op: Op::Attention {
                    layer: 0,
                    n_head: SHAPE.n_head,
                    n_head_kv: SHAPE.n_head_kv,
                    head_dim: SHAPE.hd,
                    scale: 1.0 / (SHAPE.hd as f32).sqrt(),
                    cache_type: ty,
                    window: layout,
                },
                src: vec![NodeId(0), NodeId(1)],
                shape: [row, nt],
                dtype: DType::F32,
                backend: None,
                layer: Some(0),
                dead: false,
            };
            let args = ExecArgs {
                srcs: &[Some(qb), Some(wb)],
                out: Some(ob),
                kv: Some(KvPair { k: kb, v: vb }),
                weights: &NoWeights,
            };
            be.execute_node(&node, &args).unwrap();
            let mut got = vec![0u8; 4 * nt * row];
            be.read(ob, 0, &mut got).unwrap();
            assert!(
                got.chunks_exact(4)
                    .zip(&want)
                    .all(|(g, w)| u32::from_le_bytes([g[0], g[1], g[2], g[3]]) == w.to_bits()),
                "{nt} rows, {} window values",
                window.len()
            );
        }
    }
}
