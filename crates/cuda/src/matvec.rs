//! The int8 matmuls of generation rows (ADR 0008): one token on the one-token kernels
//! (`mf_mmvq1`, the fused `mf_qkv1` + `mf_rope_store`; x quantized per block or once before
//! them, `MF_MV1_X`), from `MINFER_CUDA_MVT` rows (default 9) to 32 on the tensor-core
//! generation kernels (`mf_mmvt*`), fewer on the multi-row vector kernels (`mf_mmvqn*`), more
//! (or with those off) on the `mma` prefill tiles or the 8-token dp4a kernel, and the f32
//! matmul for the other weights. From `MINFER_CUDA_MVS` rows (default 4) to 64 the staged
//! tensor-core generation kernels (`mf_mmvs*`: 8-, 16- or 32-token tiles, up to 6 stages of
//! weights and activations in flight) come before all of those, for every matrix whose base
//! (and rows, but for Q6_K's) their 16-byte copies can align.
//! Every path keeps the canonical block order, so the choice by row count changes no bits.

use minfer_gguf::GgmlType;
use minfer_graph::{BufId, ExecArgs, KvKind, Node, QkvFused, RopeStyle};

use crate::backend::{theta_scale, type_code, CudaBackend, Matrix, Mv1Grid, Scratch};
use crate::device::{Arg, DResult};
use crate::exec::{blocks, cell_bytes, kv_code, row_threads};

/// Output rows and tokens per block of the int8 matmuls (kernels/mmvq.cu `MF_MV_*`).
const MV_ROWS: usize = 16;
const MV_T: usize = 8;
/// Fewest output rows per block of the one-token int8 kernels (a warp each; the block has
/// `mv1_warps` of them).
const MV1_ROWS: usize = 4;
/// Weight rows per block of the tensor-core generation kernels (kernels/mmvt.cu
/// `MF_MVT_ROWS`).
const MVT_ROWS: usize = 16;
/// Most rows of one matmul on those kernels (past that the `mma` prefill tiles, which
/// reuse each staged weight tile across more tokens). Measured on the H100 (7B, S_TG): 16
/// and 32 rows 1,007 and 1,524 t/s on these kernels against 610 and 1,095 on the tiles; 64
/// rows 1,596 against 1,667.
pub(crate) const MVT_MAX_ROWS: usize = 32;
/// Most rows of one matmul on the staged tensor-core generation kernels (`mf_mmvs*`; two
/// blocks of 32 tokens along the grid's x at 64).
pub(crate) const MVS_MAX_ROWS: usize = 64;
/// Rows one pass of the multi-row vector kernels takes at most.
const MVN_MAX_PASS: usize = 8;

/// The multi-row vector kernel for a pass of `k` rows (2 ..= 8): the one with the fewest
/// slots that hold them (kernels/mmvq.cu: slots past `k` repeat the last row, unused).
fn mvn_kernel(k: usize) -> &'static str {
    match k {
        ..=2 => "mf_mmvqn2",
        3..=4 => "mf_mmvqn4",
        _ => "mf_mmvqn8",
    }
}

/// The tensor-core generation kernel for `n` rows (`tall`: of a matrix with rows enough for
/// the 32-row blocks), the tokens a block of it takes (the fewest 8-token tiles that hold
/// `n`, the widest tile past that) and its threads (groups of 8 warps).
fn mvt_kernel(n: usize, tall: bool) -> (&'static str, usize, u32) {
    match (n, tall) {
        (..=8, false) => ("mf_mmvt1", 8, 256),
        (9..=16, false) => ("mf_mmvt2", 16, 256),
        (17..=32, false) => ("mf_mmvt4", 32, 256),
        (_, false) => ("mf_mmvt8", 64, 512),
        (..=8, true) => ("mf_mmvt1_m2", 8, 256),
        (9..=16, true) => ("mf_mmvt2_m2", 16, 256),
        (_, true) => ("mf_mmvt4_m2", 32, 512),
    }
}

/// The staged tensor-core generation kernels (kernels/mmvs.cu `mf_mmvs<tiles>_<shape>_<type>`)
/// by [8, 16 or 32 tokens][shape][type code - 2]; "" where two stages do not fit.
const MVS_KERNELS: [[[&str; 6]; 3]; 3] = [
    [
        [
            "mf_mmvs1_r1_q8_0",
            "mf_mmvs1_r1_q4_0",
            "mf_mmvs1_r1_q4_1",
            "mf_mmvs1_r1_q5_0",
            "mf_mmvs1_r1_q4_k",
            "mf_mmvs1_r1_q6_k",
        ],
        [
            "mf_mmvs1_r2_q8_0",
            "mf_mmvs1_r2_q4_0",
            "mf_mmvs1_r2_q4_1",
            "mf_mmvs1_r2_q5_0",
            "mf_mmvs1_r2_q4_k",
            "mf_mmvs1_r2_q6_k",
        ],
        [
            "mf_mmvs1_w16_q8_0",
            "mf_mmvs1_w16_q4_0",
            "mf_mmvs1_w16_q4_1",
            "mf_mmvs1_w16_q5_0",
            "mf_mmvs1_w16_q4_k",
            "mf_mmvs1_w16_q6_k",
        ],
    ],
    [
        [
            "mf_mmvs2_r1_q8_0",
            "mf_mmvs2_r1_q4_0",
            "mf_mmvs2_r1_q4_1",
            "mf_mmvs2_r1_q5_0",
            "mf_mmvs2_r1_q4_k",
            "mf_mmvs2_r1_q6_k",
        ],
        [
            "mf_mmvs2_r2_q8_0",
            "mf_mmvs2_r2_q4_0",
            "mf_mmvs2_r2_q4_1",
            "mf_mmvs2_r2_q5_0",
            "mf_mmvs2_r2_q4_k",
            "mf_mmvs2_r2_q6_k",
        ],
        [
            "mf_mmvs2_w16_q8_0",
            "mf_mmvs2_w16_q4_0",
            "mf_mmvs2_w16_q4_1",
            "mf_mmvs2_w16_q5_0",
            "mf_mmvs2_w16_q4_k",
            "mf_mmvs2_w16_q6_k",
        ],
    ],
    [
        [
            "mf_mmvs4_r1_q8_0",
            "mf_mmvs4_r1_q4_0",
            "mf_mmvs4_r1_q4_1",
            "mf_mmvs4_r1_q5_0",
            "mf_mmvs4_r1_q4_k",
            "mf_mmvs4_r1_q6_k",
        ],
        [
            "",
            "mf_mmvs4_r2_q4_0",
            "mf_mmvs4_r2_q4_1",
            "mf_mmvs4_r2_q5_0",
            "mf_mmvs4_r2_q4_k",
            "",
        ],
        [
            "mf_mmvs4_w16_q8_0",
            "mf_mmvs4_w16_q4_0",
            "mf_mmvs4_w16_q4_1",
            "mf_mmvs4_w16_q5_0",
            "mf_mmvs4_w16_q4_k",
            "mf_mmvs4_w16_q6_k",
        ],
    ],
];

/// The block shapes of the staged kernels: weight rows and threads a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MvsShape {
    /// 32 rows, 8 warps of two m16 tiles (`_r1`).
    Rows32,
    /// 64 rows, 16 warps of two tiles (`_r2`).
    Rows64,
    /// 32 rows, 16 warps of one tile (`_w16`).
    Warps16,
}

impl MvsShape {
    fn rows(self) -> usize {
        if self == MvsShape::Rows64 {
            64
        } else {
            32
        }
    }

    fn threads(self) -> u32 {
        if self == MvsShape::Rows32 {
            256
        } else {
            512
        }
    }
}

/// The staged tensor-core generation kernel for `n` rows of type code `ty` (2 ..= 7) in blocks
/// of `shape` ("" where that shape does not fit the type), and the tokens a block takes: the
/// fewest 8-token tiles that hold `n` up to 32, 32 past that. A table: no string is built per
/// launch.
fn mvs_kernel(n: usize, ty: i32, shape: MvsShape) -> (&'static str, usize) {
    let (t, tokens) = match n {
        ..=8 => (0, 8),
        9..=16 => (1, 16),
        _ => (2, 32),
    };
    (MVS_KERNELS[t][shape as usize][(ty - 2) as usize], tokens)
}

/// Bytes of a weight row's chunk of 8 blocks as the staged kernels hold it in shared memory
/// (kernels/mmvs.cu `mf_mvs_ws`), by the kernels' type code.
fn mvs_row_stride(ty: i32) -> usize {
    match ty {
        2 => 272,     // Q8_0
        3 | 6 => 144, // Q4_0, Q4_K
        4 | 5 => 176, // Q4_1, Q5_0
        _ => 240,     // Q6_K
    }
}

/// Whether two stages of `rows` weight rows and `tokens` tokens of type `ty` fit a block's
/// 48 KiB (kernels/mmvs.cu `mf_mvs_fits`; a staged token is 336 bytes).
fn mvs_fits(ty: i32, tokens: usize, rows: usize) -> bool {
    2 * (rows * mvs_row_stride(ty) + tokens * 336) <= 48 * 1024
}

/// Whether the staged kernels copy a matrix at `ptr` with rows of `ne0` values in `row_bytes`
/// (type `ty`) in their 16-byte units: base 16-byte aligned, rows too but for Q6_K's
/// (kernels/mmvs.cu `mf_mvs_aligned`: its chunks start at any even offset of a unit), and an
/// even number of blocks a row (the activations' (d, d * sum q) pairs two to a unit);
/// otherwise the other generation kernels take it.
fn mvs_copies(ty: i32, ptr: u64, row_bytes: usize, ne0: usize) -> bool {
    ptr.is_multiple_of(16)
        && (ty == 7 || (row_bytes as u64).is_multiple_of(16))
        && ne0.is_multiple_of(64)
}

/// The arguments the multi-row vector and tensor-core generation kernels share: the weight
/// type and matrix, `n` rows of quantized activations `(xq, xds)`, the output, the bias.
fn rows_args(
    ty: i32,
    m: &Matrix,
    (xq, xds): (u64, u64),
    out: u64,
    bias: u64,
    n: usize,
) -> [Arg; 10] {
    [
        Arg::I32(ty),
        Arg::U64(m.ptr),
        Arg::U64(m.row_bytes as u64),
        Arg::U64(xq),
        Arg::U64(xds),
        Arg::U64(out),
        Arg::U64(bias),
        Arg::I32(m.ne0 as i32),
        Arg::I32(m.ne1 as i32),
        Arg::I32(n as i32),
    ]
}

/// The one-token kernels (kernels/mmvq.cu, fused.cu) by family, walk (plain; pipelined over
/// Q4_K rows, `_p4`; over Q6_K rows, `_p6`; Q/K over Q4_K and V over Q6_K, `_p46`, Q/K/V
/// only: kernels/walk.cuh) and x (in-block, `_gx`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mv1Family {
    MatVec = 0,
    GateUp = 1,
    Qkv = 2,
}

pub(crate) const MV1_KERNELS: [[[&str; 2]; 4]; 3] = [
    [
        ["mf_mmvq1", "mf_mmvq1_gx"],
        ["mf_mmvq1_p4", "mf_mmvq1_p4_gx"],
        ["mf_mmvq1_p6", "mf_mmvq1_p6_gx"],
        ["", ""],
    ],
    [
        ["mf_gate_up1", "mf_gate_up1_gx"],
        ["mf_gate_up1_p4", "mf_gate_up1_p4_gx"],
        ["mf_gate_up1_p6", "mf_gate_up1_p6_gx"],
        ["", ""],
    ],
    [
        ["mf_qkv1", "mf_qkv1_gx"],
        ["mf_qkv1_p4", "mf_qkv1_p4_gx"],
        ["mf_qkv1_p6", "mf_qkv1_p6_gx"],
        ["mf_qkv1_p46", "mf_qkv1_p46_gx"],
    ],
];

/// The rope-fused Q/K/V kernels by [`MV1_KERNELS`]' walk and x's source (kernels/fused.cu
/// `mf_qkv1r*`).
const QKV_ROPE_KERNELS: [[&str; 2]; 4] = [
    ["mf_qkv1r", "mf_qkv1r_gx"],
    ["mf_qkv1r_p4", "mf_qkv1r_p4_gx"],
    ["mf_qkv1r_p6", "mf_qkv1r_p6_gx"],
    ["mf_qkv1r_p46", "mf_qkv1r_p46_gx"],
];

/// [`MV1_KERNELS`]' walks: the plain ones, pipelined over Q4_K, over Q6_K, over both (Q/K/V).
pub(crate) const WALK_PLAIN: usize = 0;
pub(crate) const WALK_Q4K: usize = 1;
pub(crate) const WALK_Q6K: usize = 2;
pub(crate) const WALK_Q4K_Q6K: usize = 3;

/// The walk of a one-token kernel over `ms` (one launch's matrices): [`WALK_Q4K`] when every
/// one is Q4_K at 16-byte-aligned rows, [`WALK_Q6K`] when every one is Q6_K at even
/// addresses, else [`WALK_PLAIN`]. `pipe`: the backend's `mv1_pipe`.
pub(crate) fn mv1_walk(ms: &[&Matrix], (q4k, q6k): (bool, bool)) -> usize {
    let all = |ty: GgmlType, align: u64| {
        ms.iter()
            .all(|m| m.ty == ty && (m.ptr | m.row_bytes as u64).is_multiple_of(align))
    };
    if q4k && all(GgmlType::Q4K, 16) {
        WALK_Q4K
    } else if q6k && all(GgmlType::Q6K, 2) {
        WALK_Q6K
    } else {
        WALK_PLAIN
    }
}

/// The fused Q/K/V's walk: [`mv1_walk`] over the three, or [`WALK_Q4K_Q6K`] for Q/K on the
/// Q4_K walk with V on the Q6_K one (the Q4_K_M mixture).
fn qkv_walk([q, k, v]: [&Matrix; 3], pipe: (bool, bool)) -> usize {
    match mv1_walk(&[q, k, v], pipe) {
        WALK_PLAIN if mv1_walk(&[q, k], pipe) == WALK_Q4K && mv1_walk(&[v], pipe) == WALK_Q6K => {
            WALK_Q4K_Q6K
        }
        w => w,
    }
}

/// Whether the one-token int8 kernels take rows of `ne0` (whole 32-element blocks).
pub(crate) fn mv1_fits(ne0: usize) -> bool {
    ne0.is_multiple_of(32)
}

/// Dynamic shared memory of a one-token kernel that quantizes its row of `ne0` per block
/// (None: too long for one block's shared memory, or not whole 32-blocks).
fn mv1_shared(ne0: usize) -> Option<u32> {
    let b = (ne0 + ne0 / 4) as u32;
    (ne0.is_multiple_of(32) && b <= crate::device::MAX_SHARED).then_some(b)
}

impl CudaBackend {
    /// `out[0..n]` = the `n` rows at `x` times `m` (+ `bias`) on the int8 kernels (every row
    /// count the same bits, ADR 0008), or the f32 matmul for weights they do not read.
    pub(crate) fn encode_matmul_rows(
        &mut self,
        m: &Matrix,
        (xid, r0, x): (BufId, usize, u64),
        n: usize,
        out: u64,
        b: u64,
    ) -> DResult<()> {
        let n_out = m.ne1;
        // (`MINFER_CUDA_MVS=1` takes one row to the staged kernels too: a measurement.)
        if n == 1 && self.mvs.0 != 1 && self.mmvq_kernel(m.ty).is_some() && mv1_fits(m.ne0) {
            return self.launch_mv1(m, (xid, r0, x), out, b, 0);
        }
        if let Some(kernel) = self.mmvq_kernel(m.ty) {
            let (xq, xds) = self.quantized_input((xid, r0), x, m.ne0, n)?;
            // Generation rows on the staged tensor-core kernels: weights and activations
            // through shared memory, every weight row read once for up to 32 tokens.
            let (from, _, _) = self.mvs;
            if from >= 1 && (from..=MVS_MAX_ROWS).contains(&n) {
                let ty = type_code(m.ty).ok_or("weight type")?;
                if mvs_copies(ty, m.ptr, m.row_bytes, m.ne0) {
                    return self.launch_mvs(m, (xq, xds), n, (out, b));
                }
            }
            // Generation rows on the tensor cores: every weight row read once for up to 64.
            if self.mvt_from >= 2 && (self.mvt_from..=MVT_MAX_ROWS).contains(&n) {
                return self.launch_mvt(m, (xq, xds), n, out, b);
            }
            // A few rows: the multi-row vector kernels, each row the one-token kernel's bits.
            if (2..=self.mvn_max).contains(&n) {
                return self.launch_mvn(m, (xq, xds), n, out, b);
            }
            // Many tokens: tensor-core tiles, the same bits (the canonical order).
            if let Some((k, tile)) = self.mmq_kernel(m.ty, n) {
                return self.encode_mmq(k, tile, m, (xq, xds), (out, b), (n_out, n));
            }
            return self.gpu.launch(
                kernel,
                (n_out.div_ceil(MV_ROWS) as u32, n.div_ceil(MV_T) as u32, 1),
                128,
                &[
                    Arg::U64(m.ptr),
                    Arg::U64(m.row_bytes as u64),
                    Arg::U64(xq),
                    Arg::U64(xds),
                    Arg::U64(out),
                    Arg::U64(b),
                    Arg::I32(m.ne0 as i32),
                    Arg::I32(n_out as i32),
                    Arg::I32(n as i32),
                ],
            );
        }
        let ty = type_code(m.ty).ok_or_else(|| format!("{} weights", m.ty))?;
        self.gpu.launch(
            "mf_matmul",
            (n_out as u32, n.div_ceil(16) as u32, 1),
            row_threads(m.ne0.div_ceil(32)),
            &[
                Arg::I32(ty),
                Arg::U64(m.ptr),
                Arg::U64(m.row_bytes as u64),
                Arg::U64(x),
                Arg::U64(out),
                Arg::U64(b),
                Arg::I32(m.ne0 as i32),
                Arg::I32(n_out as i32),
                Arg::I32(n as i32),
            ],
        )
    }

    /// One token's x (buffer `xid`, its row `r0` at `x`, `ne0` values) quantized for the
    /// one-token kernels, once: the int8 scratch of [`Self::quantized_input`] (which the next
    /// matmul over the same row reuses), or, with a folded RMSNorm (`norm`: gain, eps), the
    /// normalised row quantized into a scratch of its own by `mf_quantize_q8_1`.
    fn one_token_input(
        &mut self,
        (xid, r0, x): (BufId, usize, u64),
        ne0: usize,
        norm: Option<(u64, f32)>,
    ) -> DResult<(u64, u64)> {
        let Some((gain, eps)) = norm else {
            return self.quantized_input((xid, r0), x, ne0, 1);
        };
        if !mv1_fits(ne0) {
            return Err(format!(
                "int8 matmul over rows of {ne0}, not whole 32-blocks"
            ));
        }
        let q_bytes = ne0.next_multiple_of(256);
        let ptr = self.scratch(Scratch::Q8Norm, q_bytes + ne0 / 32 * 8)?;
        self.gpu.launch(
            "mf_quantize_q8_1",
            (1, 1, 1),
            1024,
            &[
                Arg::U64(x),
                Arg::U64(gain),
                Arg::F32(eps),
                Arg::U64(ptr),
                Arg::U64(ptr + q_bytes as u64),
                Arg::I32(ne0 as i32),
            ],
        )?;
        Ok((ptr, ptr + q_bytes as u64))
    }

    /// How a one-token kernel reads its x (`xid`'s row `r0` at `x`, `ne0` values; `norm`:
    /// a folded RMSNorm's gain and eps), as kernels/int8.cuh `MF_MV1_X` says: whether it is
    /// the `_gx` kernel (x quantized once before it, into the scratch), its x arguments and
    /// its dynamic shared memory. Which one is [`crate::settings::Mv1X`]'s choice by the row's
    /// length; a row too long for shared memory always goes the global way.
    pub(crate) fn mv1_input(
        &mut self,
        (xid, r0, x): (BufId, usize, u64),
        ne0: usize,
        norm: Option<(u64, f32)>,
    ) -> DResult<(bool, Vec<Arg>, u32)> {
        match mv1_shared(ne0) {
            Some(shared) if !self.mv1_x.global(ne0) => {
                let (gain, eps) = norm.unwrap_or((0, 0.0));
                Ok((
                    false,
                    vec![Arg::U64(x), Arg::U64(gain), Arg::F32(eps)],
                    shared,
                ))
            }
            _ => {
                let (xq, xds) = self.one_token_input((xid, r0, x), ne0, norm)?;
                Ok((true, vec![Arg::U64(xq), Arg::U64(xds)], 0))
            }
        }
    }

    /// `mf_mmvq1` / `mf_mmvq1_gx`: one token's `out = m · x (+ bias) (+ res)` (0 for an
    /// absent bias or residual), a warp per output row.
    pub(crate) fn launch_mv1(
        &mut self,
        m: &Matrix,
        x: (BufId, usize, u64),
        out: u64,
        bias: u64,
        res: u64,
    ) -> DResult<()> {
        let ty = type_code(m.ty).ok_or("weight type")?;
        let (gx, xa, shared) = self.mv1_input(x, m.ne0, None)?;
        let kernel =
            MV1_KERNELS[Mv1Family::MatVec as usize][mv1_walk(&[m], self.mv1_pipe)][gx as usize];
        let grid = self.mv1_grid(kernel, m.ne1, self.mv1_warps, shared)?;
        let mut a = vec![Arg::I32(ty), Arg::U64(m.ptr), Arg::U64(m.row_bytes as u64)];
        a.extend(xa);
        a.extend([
            Arg::U64(out),
            Arg::U64(bias),
            Arg::U64(res),
            Arg::I32(m.ne0 as i32),
            Arg::I32(m.ne1 as i32),
        ]);
        self.gpu
            .launch_shared(kernel, (grid, 1, 1), 32 * self.mv1_warps as u32, shared, &a)
    }

    /// `mf_mmvqn<k>`: `n` (2 ..= 16) rows' `out = m · x (+ bias)` over their quantized
    /// activations `(xq, xds)`, in the fewest passes of at most 8 rows (each pass reads the
    /// weights once), the rows shared out evenly so that no pass has fewer than 2.
    fn launch_mvn(
        &mut self,
        m: &Matrix,
        (xq, xds): (u64, u64),
        n: usize,
        out: u64,
        bias: u64,
    ) -> DResult<()> {
        let ty = type_code(m.ty).ok_or("weight type")?;
        let nb = m.ne0 / 32;
        let mut t0 = 0;
        let mut passes = n.div_ceil(MVN_MAX_PASS);
        while t0 < n {
            let k = (n - t0).div_ceil(passes);
            passes -= 1;
            let kernel = mvn_kernel(k);
            let grid = self.mv1_grid(kernel, m.ne1, self.mv1_warps, 0)?;
            let x = (xq + (t0 * m.ne0) as u64, xds + (t0 * nb * 8) as u64);
            let a = rows_args(ty, m, x, out + (t0 * m.ne1 * 4) as u64, bias, k);
            self.gpu
                .launch(kernel, (grid, 1, 1), 32 * self.mv1_warps as u32, &a)?;
            t0 += k;
        }
        Ok(())
    }

    /// `mf_mmvt<k>[_m2]`: `n` generation rows' `out = m · x (+ bias)` over their quantized
    /// activations on the tensor cores, 16 weight rows (32 for matrices of `mvt_tall` rows
    /// and up) and 8 to 64 tokens a block ([`mvt_kernel`]).
    fn launch_mvt(
        &mut self,
        m: &Matrix,
        (xq, xds): (u64, u64),
        n: usize,
        out: u64,
        bias: u64,
    ) -> DResult<()> {
        let ty = type_code(m.ty).ok_or("weight type")?;
        let tall = self.mvt_tall > 0 && m.ne1 >= self.mvt_tall;
        let (kernel, tokens, threads) = mvt_kernel(n, tall);
        let rows = if tall { 2 * MVT_ROWS } else { MVT_ROWS };
        self.gpu.launch(
            kernel,
            (n.div_ceil(tokens) as u32, m.ne1.div_ceil(rows) as u32, 1),
            threads,
            &rows_args(ty, m, (xq, xds), out, bias, n),
        )
    }

    /// `mf_mmvs*`: `n` generation rows' `out = m · x (+ bias)` over their quantized
    /// activations on the staged tensor-core kernels ([`mvs_kernel`]): 64 weight rows a block
    /// where the type's stages fit and (auto) the grid still has a block for every
    /// multiprocessor, else 32.
    fn launch_mvs(
        &mut self,
        m: &Matrix,
        (xq, xds): (u64, u64),
        n: usize,
        (out, bias): (u64, u64),
    ) -> DResult<()> {
        use crate::settings::{MvsRows, MvsWarps};
        let ty = type_code(m.ty).ok_or("weight type")?;
        let tokens = mvs_kernel(n, ty, MvsShape::Rows32).1;
        let tiles = n.div_ceil(tokens);
        let sms = self.gpu.sm_count as usize;
        let (_, rows, warps) = self.mvs;
        let rows = match rows {
            MvsRows::Fixed(r) => r,
            MvsRows::Auto if m.ne1.div_ceil(64) * tiles >= sms => 64,
            MvsRows::Auto => 32,
        };
        let shape = if rows == 64 && mvs_fits(ty, tokens, 64) {
            MvsShape::Rows64
        } else {
            match warps {
                MvsWarps::Sixteen => MvsShape::Warps16,
                MvsWarps::Eight => MvsShape::Rows32,
                MvsWarps::Auto if m.ne1.div_ceil(32) * tiles < 2 * sms => MvsShape::Warps16,
                MvsWarps::Auto => MvsShape::Rows32,
            }
        };
        let (kernel, _) = mvs_kernel(n, ty, shape);
        let a = rows_args(ty, m, (xq, xds), out, bias, n);
        self.gpu.launch(
            kernel,
            (tiles as u32, m.ne1.div_ceil(shape.rows()) as u32, 1),
            shape.threads(),
            &a[1..],
        )
    }

    /// Blocks of a one-token kernel (`warps` rows at a time each) over `rows` output rows,
    /// as [`Mv1Grid`] says: never more than a block per `warps` rows.
    pub(crate) fn mv1_grid(
        &self,
        kernel: &str,
        rows: usize,
        warps: usize,
        shared: u32,
    ) -> DResult<u32> {
        let per_rows = rows.div_ceil(warps) as u32;
        Ok(match self.mv1_grid {
            Mv1Grid::Rows => per_rows,
            Mv1Grid::Blocks(b) => per_rows.min(b),
            Mv1Grid::Wave => per_rows.min(self.gpu.resident_blocks(
                kernel,
                32 * warps as u32,
                shared,
            )?),
        })
    }

    /// [`Op::QkvRopeStore`] (no per-head norm): `mf_qkv1` then `mf_rope_store`, the unfused
    /// chain's bits (kernels/fused.cu); one `mf_qkv1r*` launch instead where the cache holds
    /// f16 or f32 (the same bits; the plain walks' `mf_qkv1r` since session 29).
    pub(crate) fn encode_qkv(&mut self, node: &Node, f: &QkvFused, args: &ExecArgs) -> DResult<()> {
        let w = args.weights;
        let (q_dim, kv_dim, hd) = (f.q_dim(), f.kv_dim(), f.rope.head_dim);
        if node.shape != [q_dim, 1] {
            return Err(format!(
                "a decode-only fused node of {q_dim} x 1, got {:?}",
                node.shape
            ));
        }
        if f.norm.is_some() {
            return Err("the per-head Q/K norm is not fused on CUDA".into());
        }
        let m = [
            self.matrix(w, f.wq)?,
            self.matrix(w, f.wk)?,
            self.matrix(w, f.wv)?,
        ];
        let ne0 = m[0].ne0;
        let dims = [q_dim, kv_dim, kv_dim];
        for (mi, d) in m.iter().zip(dims) {
            if mi.ne0 != ne0 || mi.ne1 != d || self.mmvq_kernel(mi.ty).is_none() {
                return Err(format!(
                    "fused Q/K/V over a {} matrix of {} x {} (want int8-path rows of {ne0}, {d} rows)",
                    mi.ty, mi.ne1, mi.ne0
                ));
            }
        }
        if !q_dim.is_multiple_of(MV1_ROWS) || !kv_dim.is_multiple_of(MV1_ROWS) {
            return Err(format!(
                "q {q_dim} / kv {kv_dim} rows are not whole {MV1_ROWS}-row blocks"
            ));
        }
        if !mv1_fits(ne0) {
            return Err(format!("fused Q/K/V rows of {ne0}, not whole 32-blocks"));
        }
        let bias = match f.bias {
            Some([bq, bk, bv]) => [
                self.vector(w, bq, q_dim)?,
                self.vector(w, bk, kv_dim)?,
                self.vector(w, bv, kv_dim)?,
            ],
            None => [0; 3],
        };
        let ty = kv_code(f.cache_type)?;
        let row_bytes = cell_bytes(f.cache_type, kv_dim)?;
        let (k, klen) = self.region(args, KvKind::K)?;
        let (v, _) = self.region(args, KvKind::V)?;
        let n_cells = klen / row_bytes;
        let (xid, x, xl) = self.src_buf(args, 0)?;
        if xl < ne0 * 4 {
            return Err(format!(
                "src 0 holds {xl} bytes, the node reads {}",
                ne0 * 4
            ));
        }
        let pos = self.src(args, 1, 4)?;
        let cells = self.checked_ids(args, 2, 1, n_cells, "KV cell")?;
        let out = self.out(node, args)?;
        let rows = q_dim + 2 * kv_dim;
        let row = self.scratch(Scratch::QkvRow, rows * 4)?;
        let mut a = Vec::with_capacity(17);
        for mi in &m {
            a.push(Arg::I32(type_code(mi.ty).ok_or("weight type")?));
            a.push(Arg::U64(mi.ptr));
            a.push(Arg::U64(mi.row_bytes as u64));
        }
        let norm = match f.in_norm {
            Some(n) => Some((self.vector(w, n.weight, ne0)?, n.eps)),
            None => None,
        };
        let (gx, xa, shared) = self.mv1_input((xid, 0, x), ne0, norm)?;
        a.extend(bias.map(Arg::U64));
        a.extend(xa);
        // A block's rows come from one matrix.
        let warps = if q_dim.is_multiple_of(self.mv1_warps) && kv_dim.is_multiple_of(self.mv1_warps)
        {
            self.mv1_warps
        } else {
            MV1_ROWS
        };
        let walk = qkv_walk([&m[0], &m[1], &m[2]], self.mv1_pipe);
        let neox = (f.rope.style == RopeStyle::Neox) as i32;
        let theta = theta_scale(f.rope.freq_base, hd);
        // Pairs of rows RoPE rotates together, whole heads, a block's worth of warps each.
        let pairs_fit = hd % 2 == 0
            && q_dim.is_multiple_of(hd)
            && kv_dim.is_multiple_of(hd)
            && (q_dim / 2).is_multiple_of(warps)
            && (kv_dim / 2).is_multiple_of(warps);
        // mf_rope_store's arguments after its row scratch (the fused kernels' last ones).
        let rope = [
            Arg::U64(pos),
            Arg::U64(cells),
            Arg::U64(out),
            Arg::U64(k),
            Arg::U64(v),
            Arg::I32(ty),
            Arg::U64(row_bytes as u64),
            Arg::I32(q_dim as i32),
            Arg::I32(kv_dim as i32),
            Arg::I32(hd as i32),
            Arg::F32(theta),
            Arg::F32(f.rope.freq_scale),
            Arg::I32(neox),
        ];
        if self.qkv_rope && ty != 2 && pairs_fit {
            let kernel = QKV_ROPE_KERNELS[walk][gx as usize];
            let grid = self.mv1_grid(kernel, rows / 2, warps, shared)?;
            // mf_qkv1's arguments up to x's, the row length, then RoPE's.
            a.push(Arg::I32(ne0 as i32));
            a.extend(rope);
            return self
                .gpu
                .launch_shared(kernel, (grid, 1, 1), 32 * warps as u32, shared, &a);
        }
        a.extend([
            Arg::U64(row),
            Arg::I32(ne0 as i32),
            Arg::I32(q_dim as i32),
            Arg::I32(kv_dim as i32),
        ]);
        let kernel = MV1_KERNELS[Mv1Family::Qkv as usize][walk][gx as usize];
        let grid = self.mv1_grid(kernel, rows, warps, shared)?;
        self.gpu
            .launch_shared(kernel, (grid, 1, 1), 32 * warps as u32, shared, &a)?;
        // A thread per q value, then per K and V value (f16/f32), or per 32-value q8_0
        // block; with `MINFER_CUDA_Q8_DECODE=1` a q8_0 block is one warp's 32 lanes, from the
        // next warp after q's (kernels/fused.cu).
        let warp_q8 = ty == 2 && self.q8_decode;
        let threads = match (ty, warp_q8) {
            (2, true) => q_dim.next_multiple_of(32) + 2 * kv_dim,
            (2, false) => q_dim + 2 * (kv_dim / 32),
            _ => q_dim + 2 * kv_dim,
        };
        let mut args = vec![Arg::U64(row)];
        args.extend(rope);
        args.push(Arg::I32(warp_q8 as i32));
        self.gpu
            .launch("mf_rope_store", blocks(threads, 128), 128, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel the row-count choices can name is one the device loads (a missing name
    /// is a launch error on the GPU, which no CPU run would see otherwise). Control: a name
    /// the program lacks is not in the list.
    #[test]
    fn every_chosen_kernel_is_loaded() {
        let loaded = |k: &str| crate::device::KERNELS.contains(&k);
        for n in 1..=MVT_MAX_ROWS {
            for tall in [false, true] {
                let k = mvt_kernel(n, tall).0;
                assert!(loaded(k), "{n} rows: {k}");
            }
        }
        for k in 2..=MVN_MAX_PASS {
            assert!(loaded(mvn_kernel(k)), "{k} rows: {}", mvn_kernel(k));
        }
        for n in 1..=MVS_MAX_ROWS {
            for ty in 2..=7 {
                for shape in [MvsShape::Rows32, MvsShape::Rows64, MvsShape::Warps16] {
                    let (k, tokens) = mvs_kernel(n, ty, shape);
                    assert_eq!(
                        loaded(k),
                        mvs_fits(ty, tokens, shape.rows()),
                        "{n} rows: {k}"
                    );
                }
            }
        }
        for k in MV1_KERNELS.iter().flatten().flatten() {
            assert!(k.is_empty() || loaded(k), "{k}");
        }
        for k in QKV_ROPE_KERNELS.iter().flatten() {
            assert!(k.is_empty() || loaded(k), "{k}");
        }
        assert!(!loaded("mf_mmvt3"), "control");
    }

    /// The pipelined walks take only what their kernels read: Q4_K rows at 16-byte-aligned
    /// addresses, Q6_K at even ones, every matrix of a launch of the one type, and only
    /// while switched on. Controls: an odd address, a mixed pair, the switch off.
    #[test]
    fn pipelined_walks_take_aligned_rows_of_one_type() {
        let m = |ty, ptr, row_bytes| Matrix {
            ty,
            ne0: 256,
            ne1: 4,
            ptr,
            row_bytes,
        };
        let on = (true, true);
        let q4 = m(GgmlType::Q4K, 4096, 144);
        let q6 = m(GgmlType::Q6K, 4098, 210);
        assert_eq!(mv1_walk(&[&q4, &q4], on), 1);
        assert_eq!(mv1_walk(&[&q6], on), 2);
        assert_eq!(mv1_walk(&[&m(GgmlType::Q4K, 4104, 144)], on), 0);
        assert_eq!(mv1_walk(&[&m(GgmlType::Q6K, 4097, 210)], on), 0);
        assert_eq!(mv1_walk(&[&q4, &q6], on), 0);
        assert_eq!(mv1_walk(&[&m(GgmlType::Q8_0, 4096, 34)], on), 0);
        assert_eq!(mv1_walk(&[&q4], (false, true)), 0);
        assert_eq!(mv1_walk(&[&q6], (true, false)), 0);
    }

    /// Every staged kernel the routing can name is one the device loads (compile.rs
    /// `KERNELS`), checked here without a GPU (session 19's first device call found 12
    /// missing there). Control: a name the table does not hold is not loaded either.
    #[test]
    fn every_staged_kernel_is_loaded() {
        let loaded = |k: &str| crate::compile::KERNELS.contains(&k);
        let mut named = 0;
        for k in MVS_KERNELS.iter().flatten().flatten() {
            if !k.is_empty() {
                assert!(loaded(k), "{k} is not in compile::KERNELS");
                named += 1;
            }
        }
        assert_eq!(named, 3 * 18 - 2);
        assert!(!loaded("mf_mmvs8_r1_q4_k"), "control");
    }

    /// The staged kernels' shared-memory rule as kernels/mmvs.cu states it: every type fits
    /// two stages of 32 rows at both token tiles, and of 64 rows at 16 tokens; at 32
    /// tokens the 64-row blocks take the types of at most 176-byte chunks, not Q8_0 or Q6_K
    /// (those run on 32-row blocks). Control: a 48 KiB + 1 stage pair does not fit.
    #[test]
    fn staged_kernel_stages_fit_as_the_kernels_say() {
        for ty in 2..=7 {
            for tokens in [8, 16, 32] {
                assert!(
                    mvs_fits(ty, tokens, 32),
                    "type {ty}, {tokens} tokens, 32 rows"
                );
                let wide = tokens < 32 || !matches!(ty, 2 | 7);
                assert_eq!(mvs_fits(ty, tokens, 64), wide, "type {ty}, {tokens} tokens");
            }
        }
        assert_eq!(2 * (64 * mvs_row_stride(5) + 32 * 336), 44_032);
        assert!(
            !mvs_fits(2, 32, 64) && 2 * (64 * 272 + 32 * 336) > 48 * 1024,
            "control"
        );
        assert!(mvs_copies(7, 1024, 2940, 3584) && mvs_copies(6, 1024, 2016, 3584));
        assert!(
            mvs_copies(7, 1024, 2942, 3584),
            "Q6_K rows start anywhere even"
        );
        assert!(!mvs_copies(6, 1028, 2016, 3584) && !mvs_copies(7, 1026, 2940, 3584));
        assert!(!mvs_copies(6, 1024, 2024, 3584) && !mvs_copies(6, 1024, 2016, 3616));
    }
}
