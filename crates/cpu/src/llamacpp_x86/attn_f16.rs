//! Attention over an F16 KV cache with llama.cpp's CPU flash-attention arithmetic (ggml's
//! `flash_attn_ext_f16_one_chunk`, which llama.cpp runs for batches of fewer than
//! [`GGML_FA_TILE_Q`] query rows, i.e. every decode step and short prompts, and
//! `flash_attn_ext_tiled` from there on), so that an f16 cache gives llama.cpp's rounding
//! rather than an exact softmax over f16 values. Which of these `ops::attn::attention` runs
//! for which numerics and row count: the table in `ops::attn`.
//!
//! A row's cells are those its window lists, in order (`ops::attn::Window`): the one-chunk
//! kernel takes them as a sequence, the tiled kernel by logical index (see
//! [`attend_head_tiled`] for its tiles).
//!
//! Per (query row, head), cells in order (the one-chunk kernel):
//! 1. q is rounded to f16 once;
//! 2. s = dot(k, q) · scale, the dot as ggml's AVX2 `vec_dot_f16`: 4 accumulators of 8 f32
//!    lanes, `acc = fma(k, q, acc)` over chunks of 32, then acc0 += acc2, acc1 += acc3,
//!    acc0 += acc1, the 8 lanes folded as t[l] = a[l] + a[l + 4], ((t0 + t1) + (t2 + t3));
//!    elements past the last multiple of 32 added in f64;
//! 3. online softmax in f32: if s > M { M = s; ms = exp(Mold - M); VKQ = f16(VKQ · ms) }
//!    else { vs = exp(s - M) } (ms and vs default to 1), then VKQ = f16(fma(v, vs, VKQ)) and
//!    S = fma(S, ms, vs) (GCC contracts ggml's `S*ms + vs` on FMA machines): the V
//!    accumulator VKQ is kept in f16, rounded after every update;
//! 4. out = f32(VKQ) · (1 / S).
//!
//! Checked bit for bit against llama.cpp 0c1e570 (AVX2 build) with `examples/fa_check.rs` on
//! its dumped Qcur/Kcur/Vcur/kqv_out (scripts/peer-logprobs): every output bit equal on smol
//! layers 0, 1, 5, 29 (9-token prompt) and qwen layers 0, 3, 23 (32-token prompt). With
//! `S * ms + vs` unfused, 1-2 f32 ulps differ in 1-15% of the values.
//!
//! [`attend_head_ref`] is the scalar reference; on x86-64 the same arithmetic runs vectorised
//! in `attn_f16_avx2` (AVX2, FMA, F16C) and `attn_f16_avx512` (head sizes that are multiples
//! of 32), bit-identical (`tests/attn_f16.rs`).

/// llama.cpp's query-tile size: batches of at least this many rows take its tiled f32 path.
pub const GGML_FA_TILE_Q: usize = 64;

use crate::llamacpp_x86::LlamaCppX86;
use crate::ops::attn::Call;
use crate::ops::{KResult, KernelError};
use crate::simd::Isa;
use crate::threads::{par_tasks, SharedOut};
use minfer_gguf::quants::{f16_to_f32, f32_to_f16};

#[inline]
fn h(b: u16) -> f32 {
    f16_to_f32(b)
}

/// `q`: one query head (f32); `k(c)`/`v(c)`: cell `c`'s head as f16 bits, for the cells of
/// `cells` in order; `out`: the head's output (`v` length). Runs the vectorised kernel of
/// the instruction set the CPU kernels use ([`crate::simd::detected`]).
pub fn attend_head<'a>(
    q: &[f32],
    scale: f32,
    cells: impl IntoIterator<Item = usize>,
    k: impl Fn(usize) -> &'a [u16],
    v: impl Fn(usize) -> &'a [u16],
    out: &mut [f32],
) {
    attend_head_on(crate::simd::detected(), q, scale, cells, k, v, out)
}

/// [`attend_head`] on `isa`'s kernel: AVX-512 for head sizes that are multiples of 32, AVX2
/// (FMA, F16C) otherwise and for `Isa::Avx2`, the scalar reference for the other sets.
/// Every choice gives the same bits; a set this machine lacks runs the reference.
pub fn attend_head_on<'a>(
    isa: Isa,
    q: &[f32],
    scale: f32,
    cells: impl IntoIterator<Item = usize>,
    k: impl Fn(usize) -> &'a [u16],
    v: impl Fn(usize) -> &'a [u16],
    out: &mut [f32],
) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    #[cfg(target_arch = "x86_64")]
    match kernel(isa, out.len()) {
        Kernel::Avx512 => {
            // SAFETY: `kernel` checked the features on this machine.
            unsafe { super::attn_f16_avx512::attend_head(q, scale, cells, k, v, out) };
            return;
        }
        Kernel::Avx2 => {
            // SAFETY: `kernel` checked the features on this machine.
            unsafe { super::attn_f16_avx2::attend_head(q, scale, cells, k, v, out) };
            return;
        }
        Kernel::Reference => {}
    }
    attend_head_ref(q, scale, cells, k, v, out)
}

/// Which one-chunk kernel runs on `isa` for heads of `hd`.
#[cfg(target_arch = "x86_64")]
enum Kernel {
    Avx512,
    Avx2,
    Reference,
}

#[cfg(target_arch = "x86_64")]
fn kernel(isa: Isa, hd: usize) -> Kernel {
    let avx2 = crate::cpu_features::avx2_fma_f16c();
    match isa {
        Isa::Avx512Vnni if avx2 && isa.is_available() && hd.is_multiple_of(32) => Kernel::Avx512,
        Isa::Avx512Vnni | Isa::Avx2 if avx2 => Kernel::Avx2,
        _ => Kernel::Reference,
    }
}

/// [`attend_head`] for the `q.len() / hd` query heads of one GQA group over the same cells:
/// `q` and `out` hold the heads one after another (`hd` each). Every head's result is
/// bit-identical to [`attend_head`] on it alone (the same operations per head, in the same
/// order); the heads share each cell's loads and f16 conversions, and their independent
/// dependency chains overlap.
pub fn attend_group<'a>(
    q: &[f32],
    hd: usize,
    scale: f32,
    cells: impl IntoIterator<Item = usize>,
    k: impl Fn(usize) -> &'a [u16],
    v: impl Fn(usize) -> &'a [u16],
    out: &mut [f32],
) {
    attend_group_on(crate::simd::detected(), q, hd, scale, cells, k, v, out)
}

/// [`attend_group`] on `isa`'s kernel, chosen as [`attend_head_on`] chooses.
#[allow(clippy::too_many_arguments)]
pub fn attend_group_on<'a>(
    isa: Isa,
    q: &[f32],
    hd: usize,
    scale: f32,
    cells: impl IntoIterator<Item = usize>,
    k: impl Fn(usize) -> &'a [u16],
    v: impl Fn(usize) -> &'a [u16],
    out: &mut [f32],
) {
    assert!(
        hd > 0 && q.len().is_multiple_of(hd) && out.len() == q.len(),
        "{} query values and {} outputs for heads of {hd}",
        q.len(),
        out.len()
    );
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    #[cfg(target_arch = "x86_64")]
    match kernel(isa, hd) {
        Kernel::Avx512 => {
            // SAFETY: `kernel` checked the features on this machine.
            unsafe { super::attn_f16_avx512::attend_group(q, hd, scale, cells, k, v, out) };
            return;
        }
        Kernel::Avx2 => {
            // SAFETY: `kernel` checked the features on this machine.
            unsafe { super::attn_f16_avx2::attend_group(q, hd, scale, cells, k, v, out) };
            return;
        }
        Kernel::Reference => {}
    }
    let cells: Vec<usize> = cells.into_iter().collect();
    for (qh, oh) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        attend_head_ref(qh, scale, cells.iter().copied(), &k, &v, oh);
    }
}

/// Query rows a tile of [`attend_tile_on`] takes at most in `run` (their K and V rows are
/// widened once for all of them).
pub const TILE_ROWS: usize = 16;

/// Whether `isa` has a tiled kernel ([`attend_tile_on`] other than row by row) for heads of
/// `hd`.
pub fn has_tile_kernel(isa: Isa, hd: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Kernel::Avx512 | Kernel::Avx2 = kernel(isa, hd) {
        return matches!(hd, 64 | 128);
    }
    let _ = (isa, hd);
    false
}

/// [`attend_group_on`] for several query rows of one GQA group whose windows are prefixes of
/// one list of cells: row `r`'s heads are `q[r]` (heads of `hd` one after another), its
/// window `cells[..lens[r]]`, its output `out[r]`. Every head of every row gets the bits of
/// [`attend_head_ref`] on it alone: the rows share the cells' loads and widenings, not
/// arithmetic. Where `isa` has no tiled kernel for `hd` ([`has_tile_kernel`]), row by row.
#[allow(clippy::too_many_arguments)]
pub fn attend_tile_on<'a>(
    isa: Isa,
    hd: usize,
    scale: f32,
    q: &[&[f32]],
    lens: &[usize],
    cells: &[usize],
    k: impl Fn(usize) -> &'a [u16],
    v: impl Fn(usize) -> &'a [u16],
    out: &mut [&mut [f32]],
) {
    assert!(
        q.len() == lens.len() && q.len() == out.len(),
        "{} rows of queries, {} lengths, {} outputs",
        q.len(),
        lens.len(),
        out.len()
    );
    assert!(
        lens.iter().all(|&n| n <= cells.len()),
        "a row's window past the tile's {} cells",
        cells.len()
    );
    if q.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_tile_kernel(isa, hd) {
        let g = q[0].len() / hd;
        assert!(
            g > 0
                && q.iter()
                    .zip(out.iter())
                    .all(|(q, o)| q.len() == g * hd && o.len() == g * hd),
            "every row needs {g} heads of {hd} of queries and outputs"
        );
        // SAFETY: `has_tile_kernel` checked the features on this machine.
        unsafe {
            match (kernel(isa, hd), hd) {
                (Kernel::Avx512, 64) => super::attn_f16_avx512_tile::attend_tile::<4, 4>(
                    q, lens, scale, cells, k, v, out,
                ),
                (Kernel::Avx512, _) => super::attn_f16_avx512_tile::attend_tile::<8, 2>(
                    q, lens, scale, cells, k, v, out,
                ),
                (_, 64) => {
                    super::attn_f16_avx2::attend_tile::<64>(q, lens, scale, cells, k, v, out)
                }
                _ => super::attn_f16_avx2::attend_tile::<128>(q, lens, scale, cells, k, v, out),
            }
        }
        return;
    }
    for ((qr, &n), o) in q.iter().zip(lens).zip(out.iter_mut()) {
        attend_group_on(isa, qr, hd, scale, cells[..n].iter().copied(), &k, &v, o);
    }
}

/// The scalar reference of [`attend_head`].
pub fn attend_head_ref<'a>(
    q: &[f32],
    scale: f32,
    cells: impl IntoIterator<Item = usize>,
    k: impl Fn(usize) -> &'a [u16],
    v: impl Fn(usize) -> &'a [u16],
    out: &mut [f32],
) {
    attend_head_with(dot_ref, q, scale, cells, k, v, out)
}

/// [`attend_head_ref`] with the f16 dot of another build (e.g. [`dot16_ref`], AVX-512).
pub fn attend_head_with<'a>(
    dot: fn(&[u16], &[u16]) -> f32,
    q: &[f32],
    scale: f32,
    cells: impl IntoIterator<Item = usize>,
    k: impl Fn(usize) -> &'a [u16],
    v: impl Fn(usize) -> &'a [u16],
    out: &mut [f32],
) {
    let dot_ref = dot;
    let q16: Vec<u16> = q.iter().map(|&x| f32_to_f16(x)).collect();
    let mut vkq = vec![0u16; out.len()];
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    for c in cells {
        let s = dot_ref(k(c), &q16) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > m {
            let mold = m;
            m = s;
            ms = (mold - m).exp();
            for a in vkq.iter_mut() {
                *a = f32_to_f16(h(*a) * ms);
            }
        } else {
            vs = (s - m).exp();
        }
        for (a, &x) in vkq.iter_mut().zip(v(c)) {
            *a = f32_to_f16(h(x).mul_add(vs, h(*a)));
        }
        sum = sum.mul_add(ms, vs);
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (o, &a) in out.iter_mut().zip(&vkq) {
        *o = h(a) * inv;
    }
}

/// ggml's AVX2 `vec_dot_f16`, lane for lane (see the module docs).
pub fn dot_ref(x: &[u16], y: &[u16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !31;
    let mut acc = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, lane) in a.iter_mut().enumerate() {
                let e = i + 8 * j + l;
                *lane = h(x[e]).mul_add(h(y[e]), *lane);
            }
        }
    }
    let [a0, a1, a2, a3] = acc;
    let a0: [f32; 8] = std::array::from_fn(|l| (a0[l] + a2[l]) + (a1[l] + a3[l]));
    let t: [f32; 4] = std::array::from_fn(|l| a0[l] + a0[l + 4]);
    let mut r = ((t[0] + t[1]) + (t[2] + t[3])) as f64;
    for e in np..n {
        r += (h(x[e]) * h(y[e])) as f64;
    }
    r as f32
}

/// llama.cpp's KV tile of the tiled f32 path (`GGML_FA_TILE_KV`).
pub const GGML_FA_TILE_KV: usize = 64;

/// One (query row, head) of llama.cpp's tiled flash attention (`flash_attn_ext_tiled`, batches
/// of at least [`GGML_FA_TILE_Q`] rows), as the given build computes it, over the row's `n`
/// cells by logical index: `k(i)`/`v(i)` are the heads of its `i`-th cell, `i < n`.
///
/// KV tiles: llama.cpp cuts its cache into aligned 64-cell tiles, masking the cells a row does
/// not see. Here the tiles are the aligned 64-index ranges of the row's logical sequence,
/// the last one masked past `n`. For a window of one run starting at cell 0 (llama.cpp's
/// layout of one sequence) these are llama.cpp's tiles, cell for cell. For any other layout
/// (a span not starting at 0, several runs) they are not the tiles llama.cpp would use for
/// the cells it would hold; rather than guess those, the row is tiled as if its values
/// were stored from cell 0, which makes the result independent of where they are. Per tile:
/// scores `s = fma`-chain over the head dim of f32 q times f32(k) (the simd_gemm order: one
/// running fma per output), times `scale`; masked cells are -inf; the tile max M' =
/// max(M, tile max); when it grows, `ms = expf(M - M')` scales the f32 V accumulator and S;
/// then ggml's `vec_soft_max_f32` turns scores into `v_expf(s - M')` and returns their sum in
/// f64 per vector (8 lanes folded as `hsum_float_8` on AVX2, 16 by `_mm512_reduce_add_ps` on
/// AVX-512), added to S in f64 and rounded to f32; the V accumulator takes
/// `acc = fma(p, v, acc)` over the tile's cells in order. Output: acc · (1 / S).
pub fn attend_head_tiled<'a>(
    simd: LlamaCppX86,
    q: &[f32],
    scale: f32,
    n: usize,
    k: impl Fn(usize) -> &'a [u16],
    v: impl Fn(usize) -> &'a [u16],
    out: &mut [f32],
) {
    use crate::llamacpp_x86::{expf::v_expf, hsum8, reduce16};
    const T: usize = GGML_FA_TILE_KV;
    let mut acc = vec![0f32; out.len()];
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    let mut p = [0f32; T];
    if n == 0 {
        out.fill(0.0);
        return;
    }
    for ic in (0..n).step_by(T) {
        let mut tile_max = f32::NEG_INFINITY;
        for (tk, p) in p.iter_mut().enumerate() {
            let c = ic + tk;
            *p = if c < n {
                let kc = k(c);
                let mut s = 0f32;
                for (&qv, &kv) in q.iter().zip(kc) {
                    s = qv.mul_add(h(kv), s);
                }
                s * scale
            } else {
                f32::NEG_INFINITY
            };
            tile_max = tile_max.max(*p);
        }
        if tile_max == f32::NEG_INFINITY {
            continue;
        }
        let m_new = m.max(tile_max);
        if m_new > m {
            let ms = (m - m_new).exp();
            for a in acc.iter_mut() {
                *a *= ms;
            }
            sum *= ms;
        }
        m = m_new;
        for p in p.iter_mut() {
            *p = v_expf(simd, *p - m);
        }
        let tile_sum: f64 = match simd {
            LlamaCppX86::Avx2 => p
                .chunks_exact(8)
                .map(|c| hsum8(c.try_into().expect("8 lanes")) as f64)
                .sum(),
            LlamaCppX86::Avx512 => p
                .chunks_exact(16)
                .map(|c| reduce16(c.try_into().expect("16 lanes")) as f64)
                .sum(),
        };
        sum = (sum as f64 + tile_sum) as f32;
        for (tk, &pk) in p.iter().enumerate() {
            let c = ic + tk;
            if c >= n {
                // ggml multiplies these cells' V (finite) by an exact 0: no change.
                continue;
            }
            for (a, &x) in acc.iter_mut().zip(v(c)) {
                *a = pk.mul_add(h(x), *a);
            }
        }
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (o, &a) in out.iter_mut().zip(&acc) {
        *o = a * inv;
    }
}

/// ggml's `vec_dot_f16` in an AVX-512 (F, no FP16) build: 4 accumulators of 16 f32 lanes,
/// `acc = fma(k, q, acc)` over chunks of 64, then acc0 += acc2, acc1 += acc3, acc0 += acc1,
/// the 16 lanes folded by GCC's `_mm512_reduce_add_ps` ([`crate::llamacpp_x86::reduce16`]);
/// elements past the last multiple of 64 added in f64.
pub fn dot16_ref(x: &[u16], y: &[u16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, lane) in a.iter_mut().enumerate() {
                let e = i + 16 * j + l;
                *lane = h(x[e]).mul_add(h(y[e]), *lane);
            }
        }
    }
    let [a0, a1, a2, a3] = acc;
    let a0: [f32; 16] = std::array::from_fn(|l| (a0[l] + a2[l]) + (a1[l] + a3[l]));
    let mut r = crate::llamacpp_x86::reduce16(&a0) as f64;
    for e in np..n {
        r += (h(x[e]) * h(y[e])) as f64;
    }
    r as f32
}

/// The K and V regions as f16 bits (the backend's regions are f32 buffers, so aligned).
fn as_f16(b: &[u8]) -> KResult<&[u16]> {
    // SAFETY: every bit pattern is a valid u16; align_to only yields aligned elements.
    let (pre, vals, _) = unsafe { b.align_to::<u16>() };
    if pre.is_empty() && cfg!(target_endian = "little") {
        Ok(vals)
    } else {
        Err(KernelError("f16 KV region is not 2-byte aligned".into()))
    }
}

/// Runs the attention call `c` (an F16 cache) with this module's arithmetic:
/// - `simd` `Some`: as that llama.cpp build does, [`attend_head_tiled`] when the call has at
///   least [`GGML_FA_TILE_Q`] query rows, else the one-chunk kernel (the AVX2 build's
///   [`attend_head`], the AVX-512 build's 16-lane dot [`dot16_ref`]);
/// - `None`: [`attend_head`] for every row, whatever the row count.
///
/// [`attend_head`]'s rows run a task per (token, KV head, part of the GQA group), the part's
/// heads in one [`attend_group`] call (the same bits as a head alone); the other kernels a
/// task per (token, head).
pub(crate) fn run(
    simd: Option<LlamaCppX86>,
    c: &Call,
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    c.check_out(out)?;
    let (p, hd) = (c.p, c.p.head_dim);
    let nt = c.n_tokens();
    let (k16, v16) = (as_f16(c.k)?, as_f16(c.v)?);
    let group = p.n_head / p.n_head_kv;
    let tiled = simd.filter(|_| nt >= GGML_FA_TILE_Q);
    let outp = SharedOut::new(out);
    let one_chunk_avx2 = tiled.is_none() && simd != Some(LlamaCppX86::Avx512);
    if one_chunk_avx2 {
        let isa = crate::simd::detected();
        if has_tile_kernel(isa, hd) {
            let tiles = tiles(&c.windows, TILE_ROWS);
            if tiles.iter().any(|t| t.rows > 1) {
                run_tiles(isa, c, &tiles, &outp, threads);
                return Ok(());
            }
        }
        // A task per (token, KV head, part of its GQA group): the part's heads run together
        // (the same bits as one task per head, see `attend_group`). Groups are cut into parts
        // only where (token, KV head) pairs are fewer than the threads (a decode step: one
        // token); heads are independent, so the cut changes no bit, but each part reads and
        // widens the group's K and V again.
        let parts = threads.div_ceil(nt * p.n_head_kv).clamp(1, group);
        let per = group.div_ceil(parts);
        let parts = group.div_ceil(per);
        par_tasks(nt * p.n_head_kv * parts, threads, |task| {
            let (pair, part) = (task / parts, task % parts);
            let (t, g) = (pair / p.n_head_kv, pair % p.n_head_kv);
            let h0 = g * group + part * per;
            let w = per.min(group - part * per) * hd;
            let first = (t * p.n_head + h0) * hd;
            // SAFETY: tasks own disjoint slices of `out`: their heads of their token.
            let o = unsafe { outp.part(first, w) };
            let head_off = g * c.head_bytes;
            let at = |cell: usize| {
                let o = (cell * c.cell_bytes + head_off) / 2;
                o..o + hd
            };
            attend_group(
                &c.q[first..][..w],
                hd,
                p.scale,
                c.windows[t].cells(),
                |cell| &k16[at(cell)],
                |cell| &v16[at(cell)],
                o,
            );
        });
        return Ok(());
    }
    // One task per (token, head); task `t * n_head + h` owns `out[task * hd..][..hd]`.
    par_tasks(nt * p.n_head, threads, |task| {
        // SAFETY: tasks own disjoint `hd`-long slices of `out`.
        let o = unsafe { outp.part(task * hd, hd) };
        let (t, h) = (task / p.n_head, task % p.n_head);
        let head_off = (h / group) * c.head_bytes;
        // Cell c's head, in f16 elements (cell and head offsets are in bytes).
        let at = |cell: usize| {
            let o = (cell * c.cell_bytes + head_off) / 2;
            o..o + hd
        };
        let window = &c.windows[t];
        let q = &c.q[(t * p.n_head + h) * hd..][..hd];
        if let Some(simd) = tiled {
            let cells: Vec<usize> = window.cells().collect();
            attend_head_tiled(
                simd,
                q,
                p.scale,
                cells.len(),
                |i| &k16[at(cells[i])],
                |i| &v16[at(cells[i])],
                o,
            );
        } else {
            // The AVX-512 build's one-chunk kernel (the others returned above).
            attend_head_with(
                dot16_ref,
                q,
                p.scale,
                window.cells(),
                |cell| &k16[at(cell)],
                |cell| &v16[at(cell)],
                o,
            );
        }
    });
    Ok(())
}

/// Consecutive query rows of a call whose windows are prefixes of one of them (`base`).
struct Tile {
    t0: usize,
    rows: usize,
    base: usize,
}

/// The call's rows cut into [`Tile`]s of at most `max_rows`, in order: a row joins the
/// current tile when its window is a prefix of the tile's longest or the longest is a
/// prefix of it (a prompt's rows: each window one cell longer than the last).
fn tiles(windows: &[crate::ops::attn::Window], max_rows: usize) -> Vec<Tile> {
    let mut tiles: Vec<Tile> = Vec::new();
    for (t, w) in windows.iter().enumerate() {
        if let Some(tile) = tiles.last_mut() {
            let base = &windows[tile.base];
            if tile.rows < max_rows {
                if w.is_prefix_of(base) {
                    tile.rows += 1;
                    continue;
                }
                if base.is_prefix_of(w) {
                    tile.rows += 1;
                    tile.base = t;
                    continue;
                }
            }
        }
        tiles.push(Tile {
            t0: t,
            rows: 1,
            base: t,
        });
    }
    tiles
}

/// The one-chunk kernel's rows by tiles: a task per (tile, KV head), the longest first,
/// [`attend_tile_on`] over the tile's rows and the group's heads (a tile of one row:
/// [`attend_group`]). The same bits as row by row.
fn run_tiles(isa: Isa, c: &Call, tiles: &[Tile], outp: &SharedOut, threads: usize) {
    let (p, hd) = (c.p, c.p.head_dim);
    let group = p.n_head / p.n_head_kv;
    let (k16, v16) = match (as_f16(c.k), as_f16(c.v)) {
        (Ok(k), Ok(v)) => (k, v),
        _ => unreachable!("checked by run"),
    };
    let cost = |t: &Tile| t.rows * c.windows[t.base].len();
    let mut tasks: Vec<(usize, usize)> = (0..tiles.len())
        .flat_map(|ti| (0..p.n_head_kv).map(move |g| (ti, g)))
        .collect();
    tasks.sort_by_key(|&(ti, _)| std::cmp::Reverse(cost(&tiles[ti])));
    par_tasks(tasks.len(), threads, |task| {
        let (ti, g) = tasks[task];
        let tile = &tiles[ti];
        let head_off = g * c.head_bytes;
        let at = |cell: usize| {
            let o = (cell * c.cell_bytes + head_off) / 2;
            o..o + hd
        };
        let rows = tile.t0..tile.t0 + tile.rows;
        let first = |t: usize| (t * p.n_head + g * group) * hd;
        let w = group * hd;
        // SAFETY: tasks own disjoint slices of `out`: their group's heads of their rows.
        let mut outs: Vec<&mut [f32]> = rows
            .clone()
            .map(|t| unsafe { outp.part(first(t), w) })
            .collect();
        let qs: Vec<&[f32]> = rows.clone().map(|t| &c.q[first(t)..][..w]).collect();
        if tile.rows == 1 {
            attend_group_on(
                isa,
                qs[0],
                hd,
                p.scale,
                c.windows[tile.t0].cells(),
                |cell| &k16[at(cell)],
                |cell| &v16[at(cell)],
                outs[0],
            );
            return;
        }
        let lens: Vec<usize> = rows.map(|t| c.windows[t].len()).collect();
        let cells: Vec<usize> = c.windows[tile.base].cells().collect();
        attend_tile_on(
            isa,
            hd,
            p.scale,
            &qs,
            &lens,
            &cells,
            |cell| &k16[at(cell)],
            |cell| &v16[at(cell)],
            &mut outs,
        );
    });
}
