//! minfer's own matmul arithmetic: the per-task kernel the driver ([`super`]) runs.
//!
//! Each task walks its weight rows 16 at a time, every tile of [`TILE`] tokens of a chunk of
//! rows before the next chunk, so the rows stay in cache for the batch: full tiles through
//! the tile kernel of the weight type where there is one (8 tokens per call; a last partial
//! tile of at least [`PAD_FROM`] tokens padded with zero rows), the tokens left over through
//! the side kernel (one activation row against many weight rows per call), else per row and
//! token (4 tokens per call where a type has such a kernel). Every path gives each
//! (row, token) the bits of the scalar reference dot (`tests/simd_exact.rs`,
//! `tests/split_exact.rs`), and no token's result depends on the others (batch invariance:
//! a padded tile's lanes are independent).

use super::packed::X16;
use super::{
    add_bias, encode_activations, par_row_tasks, with_scratch, RowsOut, Shape, Split, Weight,
    ROWS_PER_TASK,
};
use crate::dot::RowKernel;
use crate::ops::{KResult, KernelError};
use crate::simd::{
    finish_tile, ActFacts, Dot4Fn, DotFn, RowSideFn, TileAcc, TileFn, TilePairFn, TileSide,
    TileSlice, X16FactsFns, X16Fns, X16Wide, TILE,
};
use minfer_gguf::quants;
use std::ops::Range;

/// Activation bytes of one block range of the tile kernels: with the task's weight rows of
/// that range (~9 KiB for Q4_K) they fit the 32 KiB L1 data cache.
const TILE_ACT_BYTES: usize = 12 * 1024;

/// A last partial tile of at least this many tokens goes through the tile kernel padded with
/// zero rows: one tile call costs less than 4 passes of the side (or single-row) kernels over
/// the weights (`benches/batched_decode.rs`).
const PAD_FROM: usize = 4;

/// Weight bytes per chunk of the side kernels when a task dots several tokens: the chunk
/// stays in L2 while every token passes over it.
const SIDE_CHUNK_BYTES: usize = 64 * 1024;

thread_local! {
    /// Each thread's buffer for the prompt form's expanded groups (grows to the largest).
    static WIDE_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Prefetches the cache lines of `bytes` into the data caches (a hint; no effect off x86).
#[inline]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for i in (0..bytes.len()).step_by(64) {
        // SAFETY: `_mm_prefetch` never faults; the address is inside `bytes`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                bytes.as_ptr().add(i).cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Activation row `t`'s facts in the side table `table` (filled for every row).
fn facts_of(table: &TileSide, t: usize) -> ActFacts<'_> {
    let (d, sums) = table.row(t);
    ActFacts { d, sums }
}

/// `x`: `[n_tokens][k]`, `out`: `[n_tokens][m]`, optional f32 `bias` of `m`.
pub fn matmul(
    w: &Weight,
    x: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    let shape = Shape::check(w, x, bias, out)?;
    let Shape { k, m, nt, wrb } = shape;
    let packed = match w.layout.weight_type() {
        None => None,
        Some(ty) if ty == w.ty => Some(crate::simd::x16_kernel(ty).ok_or_else(|| {
            KernelError(format!(
                "{ty} weights packed 16 rows at a time need a packed kernel (AVX2 or AVX-512 \
                 VNNI), which the instruction set in use ({}) does not have",
                crate::simd::detected()
            ))
        })?),
        Some(ty) => {
            return Err(KernelError(format!(
                "{} weights cannot be in the packed {ty} layout",
                w.ty
            )))
        }
    };
    let at = quants::vec_dot_type(w.ty);
    let arb = shape.act_row_bytes(at)?;
    let kernel = RowKernel::for_type(w.ty);
    // Packed weights take every token count through the packed kernels, four tokens a call
    // (the tile kernels read plain rows: a group unpacked for them each forward made the
    // demo model's pp512 0.65x and its batched decode 0.6x the packed kernels', Session 22 in
    // docs/PERFORMANCE.md).
    let tile = kernel.tile(k, wrb, arb).filter(|_| packed.is_none());
    // Tokens the tile kernels take: the full tiles, and a last partial one padded with zero
    // rows when it holds at least PAD_FROM tokens.
    let tiled = match tile {
        Some(_) if nt % TILE >= PAD_FROM => nt.next_multiple_of(TILE),
        Some(_) => nt / TILE * TILE,
        None => 0,
    };
    let out = &mut out[..nt * m];
    with_scratch(|sc| {
        let rows = tiled.max(nt);
        let fit = encode_activations(at, &x[..nt * k], k, arb, rows, sc, tile.is_some(), threads)?;
        let (tile, tiled) = match tile {
            Some(f) if fit => (Some(f), tiled),
            _ => (None, 0),
        };
        // The tokens past the tiles: the side kernel with per-row activation facts, where one
        // exists, and the packed kernels that read those facts (Q4_0, Q5_0, Q8_0: each
        // activation block's d and Σ q once per matmul, not once per group of 16 rows).
        let side = kernel.side(k, wrb, arb);
        let packed_facts = packed.and_then(|p| p.facts);
        let rows_filled = (side.is_some() || packed_facts.is_some())
            && tiled < nt
            && sc.side.fill_rows(at, &sc.act[..nt * arb], arb);
        let side = side.filter(|_| rows_filled);
        let packed_facts = packed_facts.filter(|_| rows_filled);
        // Weight blocks per range of the tile kernels: ~12 KiB of activations (8 tokens).
        let blocks = k / w.ty.block_size() as usize;
        let tile_blocks = (TILE_ACT_BYTES / (TILE * (arb / blocks.max(1)).max(1))).max(1);
        let task = Task {
            w: w.bytes,
            wrb,
            k,
            act: &sc.act,
            arb,
            nt,
            kernel,
            bare: kernel.bare(k, wrb, arb),
            bare4: kernel.bare4(k, wrb, arb),
            tile: tile.map(|f| (f, &sc.side)),
            tiled,
            pair: tile.and(kernel.tile_pair(k, wrb, arb)),
            side: side.map(|f| (f, &sc.side)),
            blocks,
            tile_blocks,
            packed,
            packed_facts: packed_facts.map(|f| (f, &sc.side)),
            grouped: if packed.is_some() { m / X16 * X16 } else { 0 },
        };
        par_row_tasks(out, m, nt, Split::batched(m, nt, threads), |o| task.run(o))
    })?;
    add_bias(bias, m, out);
    Ok(())
}

/// One matmul's kernels, resolved once, and the bytes they read.
struct Task<'a> {
    w: &'a [u8],
    /// Bytes per weight row.
    wrb: usize,
    k: usize,
    /// Encoded activations, `nt` rows of `arb` bytes.
    act: &'a [u8],
    arb: usize,
    nt: usize,
    kernel: RowKernel,
    bare: Option<DotFn>,
    bare4: Option<Dot4Fn>,
    /// The tile kernel with the side table it reads, and the tokens it takes (whole tiles,
    /// the last one possibly padded past `nt`).
    tile: Option<(TileFn, &'a TileSide)>,
    tiled: usize,
    /// The two-tile kernel, where the type has one (used with `tile`'s side table).
    pair: Option<TilePairFn>,
    /// The side kernel (decode) with the side table it reads.
    side: Option<(RowSideFn, &'a TileSide)>,
    /// Weight blocks per row, and per block range of the tile kernel.
    blocks: usize,
    tile_blocks: usize,
    /// The packed kernels (one token and four a call) where the weight is in a packed
    /// layout; rows `0..grouped` are then packed groups, the rest plain rows at their plain
    /// offsets.
    packed: Option<X16Fns>,
    /// The packed kernels' forms reading the activation rows' facts, with the side table
    /// holding them (filled for every row), where the type has them.
    packed_facts: Option<(X16FactsFns, &'a TileSide)>,
    grouped: usize,
}

impl Task<'_> {
    /// Plain row `o` (never a row of a packed group).
    fn w_row(&self, o: usize) -> &[u8] {
        debug_assert!(o >= self.grouped, "row {o} is packed");
        &self.w[o * self.wrb..(o + 1) * self.wrb]
    }

    /// Rows `chunk`'s bytes (plain rows: the tile kernels never see a packed weight).
    fn plain_rows(&self, chunk: Range<usize>) -> &[u8] {
        debug_assert!(chunk.start >= self.grouped, "rows {chunk:?} are packed");
        &self.w[chunk.start * self.wrb..chunk.end * self.wrb]
    }

    fn act_row(&self, t: usize) -> &[u8] {
        &self.act[t * self.arb..(t + 1) * self.arb]
    }

    /// Every (weight row, token) dot of the task's rows. Full tiles of [`TILE`] tokens go
    /// through the tile kernel [`ROWS_PER_TASK`] rows at a time, every tile of a chunk of rows
    /// before the next chunk (so a long task of a decode batch streams its weights once, not
    /// once per tile); the tokens past the tiles through the side kernel or row by row. Each (row, token) gets the same kernel and block ranges wherever it sits, so the
    /// grouping changes no bits.
    fn run(&self, out: &mut RowsOut) -> KResult<()> {
        let full = self.tiled;
        if let Some((f, side)) = self.tile.filter(|_| full > 0) {
            let rows = out.rows();
            for c0 in rows.clone().step_by(ROWS_PER_TASK) {
                let chunk = c0..(c0 + ROWS_PER_TASK).min(rows.end);
                // The next chunk of this task, fetched while this one computes.
                let mut ahead = chunk.end..(chunk.end + ROWS_PER_TASK).min(rows.end);
                let wrows = self.plain_rows(chunk.clone());
                let mut t0 = 0;
                while t0 < full {
                    // Two tiles per call where the type has a two-tile kernel.
                    match self.pair {
                        Some(p) if t0 + 2 * TILE <= full => {
                            self.tiles::<2>(
                                |w, a, s, r, st| p(w, a, self.arb, s, r, st),
                                side,
                                t0,
                                (chunk.clone(), wrows),
                                ahead.clone(),
                                out,
                            );
                            t0 += 2 * TILE;
                        }
                        _ => {
                            self.tiles::<1>(
                                |w, [a], [s], r, [st]| f(w, a, self.arb, s, r, st),
                                side,
                                t0,
                                (chunk.clone(), wrows),
                                ahead.clone(),
                                out,
                            );
                            t0 += TILE;
                        }
                    }
                    ahead = 0..0;
                }
            }
        }
        let tail = full.min(self.nt)..self.nt;
        if !tail.is_empty() {
            if let Some(x16) = self.packed {
                self.packed_rows(x16, tail, out)?;
                return Ok(());
            }
            match self.side {
                Some((f, table)) => self.side_rows(f, table, tail, out),
                None => self.row_by_row(tail, out)?,
            }
        }
        Ok(())
    }

    /// `N` full tiles of tokens from `t0` through the tile kernel `f` (one or two tiles per
    /// call) for weight rows `chunk` (at most [`ROWS_PER_TASK`] of the task's rows, whose
    /// plain bytes are `wrows`), prefetching rows `ahead`'s bytes of each block range as it
    /// goes.
    fn tiles<const N: usize>(
        &self,
        f: impl Fn(&[u8], [&[u8]; N], [TileSlice; N], Range<usize>, &mut [TileAcc; N]),
        side: &TileSide,
        t0: usize,
        (chunk, wrows): (Range<usize>, &[u8]),
        ahead: Range<usize>,
        out: &mut RowsOut,
    ) {
        assert!(
            chunk.len() <= ROWS_PER_TASK,
            "tiles run {ROWS_PER_TASK} rows at a time"
        );
        let acts: [&[u8]; N] = std::array::from_fn(|j| {
            let t = t0 + j * TILE;
            &self.act[t * self.arb..(t + TILE) * self.arb]
        });
        let sides: [TileSlice; N] = std::array::from_fn(|j| side.tile(t0 / TILE + j));
        let block_bytes = self.wrb / self.blocks.max(1);
        // Blocks in ranges whose activations stay in L1 while every row of the chunk uses
        // them; each (row, token) still adds its blocks in order.
        let mut states = [[TileAcc::default(); N]; ROWS_PER_TASK];
        for b0 in (0..self.blocks).step_by(self.tile_blocks) {
            let range = b0..(b0 + self.tile_blocks).min(self.blocks);
            let bytes = range.start * block_bytes..range.end * block_bytes;
            let mut pre = ahead.clone();
            for (wr, state) in wrows.chunks_exact(self.wrb).zip(&mut states[..chunk.len()]) {
                if let Some(p) = pre.next() {
                    prefetch(&self.w_row(p)[bytes.clone()]);
                }
                f(wr, acts, sides, range.clone(), state);
            }
        }
        let at = chunk.start - out.rows().start;
        for j in 0..N {
            let t = t0 + j * TILE;
            // Token-major: each token's outputs of the chunk are contiguous in `out`.
            let mut vals = [[0f32; ROWS_PER_TASK]; TILE];
            for (r, state) in states[..chunk.len()].iter().enumerate() {
                for (i, v) in finish_tile(&state[j]).into_iter().enumerate() {
                    vals[i][r] = v;
                }
            }
            // A padded tile's zero rows have no outputs.
            let real = (self.nt - t).min(TILE);
            for (i, v) in vals[..real].iter().enumerate() {
                out.token(t + i)[at..at + chunk.len()].copy_from_slice(&v[..chunk.len()]);
            }
        }
    }

    /// Decode: the task's rows per token in calls of the side kernel; with several tokens,
    /// in chunks of about [`SIDE_CHUNK_BYTES`] of weights, every token's dots of a chunk
    /// before the next chunk, so that the weights come from memory once, not once per token.
    fn side_rows(&self, f: RowSideFn, table: &TileSide, tokens: Range<usize>, out: &mut RowsOut) {
        let rows = out.rows();
        let per_chunk = if tokens.len() > 1 {
            (SIDE_CHUNK_BYTES / self.wrb.max(1)).max(ROWS_PER_TASK)
        } else {
            rows.len().max(1)
        };
        for c0 in rows.clone().step_by(per_chunk) {
            let chunk = c0..(c0 + per_chunk).min(rows.end);
            let wrs = &self.w[chunk.start * self.wrb..chunk.end * self.wrb];
            let at = chunk.start - rows.start;
            for t in tokens.clone() {
                let (d, sums) = table.row(t);
                f(
                    wrs,
                    self.act_row(t),
                    d,
                    sums,
                    &mut out.token(t)[at..at + chunk.len()],
                );
            }
        }
    }

    /// Decode on packed weights: the tokens against each packed group of the task's rows by
    /// the packed kernels (their forms reading each activation block's d and Σ q from the
    /// side table where the type has them: the sums once per matmul, not once per group),
    /// four tokens a call and the rest one at a time (in chunks of about
    /// [`SIDE_CHUNK_BYTES`] with several tokens, as [`Task::side_rows`]); the plain rows past
    /// the last group by the side kernel or row by row.
    fn packed_rows(&self, x16: X16Fns, tokens: Range<usize>, out: &mut RowsOut) -> KResult<()> {
        let rows = out.rows();
        let per_chunk = if tokens.len() > 1 {
            (SIDE_CHUNK_BYTES / self.wrb.max(1))
                .next_multiple_of(X16)
                .max(X16)
        } else {
            rows.len().max(1)
        };
        // The prompt form: each group expanded once for all the tokens, four at a time, from
        // the type's token count (`X16Wide::from`).
        let wide = x16
            .wide
            .filter(|w| tokens.len() >= w.from && (!w.facts || self.packed_facts.is_some()));
        let mut vals = [[0f32; X16]; 4];
        for c0 in rows.clone().step_by(per_chunk) {
            let chunk = c0..(c0 + per_chunk).min(rows.end);
            let grouped = chunk.start..chunk.end.min(self.grouped).max(chunk.start);
            if let Some(wide) = wide {
                self.wide_groups((wide, x16), grouped.clone(), tokens.clone(), out);
            }
            let mut t = if wide.is_some() {
                tokens.end
            } else {
                tokens.start
            };
            while t < tokens.end {
                let n = if tokens.end - t >= 4 { 4 } else { 1 };
                for o in grouped.clone().step_by(X16) {
                    let g = &self.w[o * self.wrb..(o + X16) * self.wrb];
                    let a = |i: usize| self.act_row(t + i);
                    match (self.packed_facts, n) {
                        (Some((f, table)), 4) => {
                            let facts = std::array::from_fn(|i| facts_of(table, t + i));
                            (f.four)(g, std::array::from_fn(a), facts, &mut vals);
                        }
                        (Some((f, table)), _) => (f.one)(g, a(0), facts_of(table, t), &mut vals[0]),
                        (None, 4) => (x16.four)(g, std::array::from_fn(a), &mut vals),
                        (None, _) => (x16.one)(g, a(0), &mut vals[0]),
                    }
                    let at = o - rows.start;
                    for (i, v) in vals[..n].iter().enumerate() {
                        out.token(t + i)[at..at + X16].copy_from_slice(v);
                    }
                }
                t += n;
            }
            let plain = grouped.end..chunk.end;
            if plain.is_empty() {
                continue;
            }
            let at = plain.start - rows.start;
            for t in tokens.clone() {
                let a = self.act_row(t);
                match self.side {
                    Some((f, table)) => {
                        let (d, sums) = table.row(t);
                        let wrs = &self.w[plain.start * self.wrb..plain.end * self.wrb];
                        f(wrs, a, d, sums, &mut out.token(t)[at..at + plain.len()]);
                    }
                    None => {
                        for r in plain.clone() {
                            let v = self.kernel.dot(self.k, self.w_row(r), a)?;
                            out.set(t, r, v);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The packed groups `groups` (whole groups of the task's rows) against `tokens` by the
    /// prompt form `wide` of the packed kernels `x16`: each group expanded once into this
    /// thread's buffer, then dotted with four tokens a call; the last 1-3 tokens by the
    /// one-row kernel on the packed group (its facts form where `wide` reads facts: the
    /// matmul has filled them). Every path gives each dot the reference's bits.
    fn wide_groups(
        &self,
        (wide, x16): (X16Wide, X16Fns),
        groups: Range<usize>,
        tokens: Range<usize>,
        out: &mut RowsOut,
    ) {
        let rows = out.rows();
        let bytes = self.blocks * wide.block_bytes;
        let facts = self.packed_facts.filter(|_| wide.facts);
        let none = ActFacts { d: &[], sums: &[] };
        WIDE_BUF.with_borrow_mut(|buf| {
            // 64 bytes of slack so that the expansion can start on a cache line.
            buf.resize(bytes + 64, 0);
            let skip = buf.as_ptr().align_offset(64).min(64);
            let e = &mut buf[skip..skip + bytes];
            let mut vals = [[0f32; X16]; 4];
            for o in groups.step_by(X16) {
                let g = &self.w[o * self.wrb..(o + X16) * self.wrb];
                (wide.expand)(g, e);
                let at = o - rows.start;
                let mut t = tokens.start;
                while t < tokens.end {
                    let n = if tokens.end - t >= 4 { 4 } else { 1 };
                    let a = |i: usize| self.act_row(t + i);
                    match (facts, n) {
                        (Some((_, table)), 4) => {
                            let f = std::array::from_fn(|i| facts_of(table, t + i));
                            (wide.four)(e, std::array::from_fn(a), f, &mut vals);
                        }
                        (None, 4) => (wide.four)(e, std::array::from_fn(a), [none; 4], &mut vals),
                        (Some((f, table)), _) => (f.one)(g, a(0), facts_of(table, t), &mut vals[0]),
                        (None, _) => (x16.one)(g, a(0), &mut vals[0]),
                    }
                    for (i, v) in vals[..n].iter().enumerate() {
                        out.token(t + i)[at..at + X16].copy_from_slice(v);
                    }
                    t += n;
                }
            }
        });
    }

    /// Per weight row and token (4 tokens per call where the type has such a kernel).
    fn row_by_row(&self, tokens: Range<usize>, out: &mut RowsOut) -> KResult<()> {
        for o in out.rows() {
            let wr = self.w_row(o);
            let mut t = tokens.start;
            if let Some(f4) = self.bare4 {
                // 4 tokens per call: the weight row's blocks are unpacked once.
                while t + 4 <= tokens.end {
                    let a = |i: usize| self.act_row(t + i);
                    let v = f4(wr, [a(0), a(1), a(2), a(3)]);
                    for (i, v) in v.into_iter().enumerate() {
                        out.set(t + i, o, v);
                    }
                    t += 4;
                }
            }
            for t in t..tokens.end {
                let a = self.act_row(t);
                let v = match self.bare {
                    Some(f) => f(wr, a),
                    None => self.kernel.dot(self.k, wr, a)?,
                };
                out.set(t, o, v);
            }
        }
        Ok(())
    }
}
