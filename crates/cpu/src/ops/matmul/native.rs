//! minfer's own matmul arithmetic: the per-task kernel the driver ([`super`]) runs.
//!
//! Each task walks its weight rows once per tile of [`TILE`] tokens, so the rows stay in cache
//! for the batch: full tiles through the tile kernel of the weight type where there is one
//! (8 tokens per call), decode (fewer tokens than a tile) through the side kernel (all of the
//! task's rows per call), the rest per row and token (4 tokens per call where a type has such
//! a kernel). Every path gives each (row, token) the bits of the scalar reference dot
//! (`tests/simd_exact.rs`, `tests/split_exact.rs`).

use super::{
    add_bias, encode_activations, par_row_tasks, with_scratch, RowsOut, Shape, Split, Weight,
    ROWS_PER_TASK,
};
use crate::dot::RowKernel;
use crate::ops::KResult;
use crate::simd::{finish_tile, Dot4Fn, DotFn, RowSideFn, TileAcc, TileFn, TileSide, TILE};
use minfer_gguf::quants;
use std::ops::Range;

/// Activation bytes of one block range of the tile kernels: with the task's weight rows of
/// that range (~9 KiB for Q4_K) they fit the 32 KiB L1 data cache.
const TILE_ACT_BYTES: usize = 12 * 1024;

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
    let at = quants::vec_dot_type(w.ty);
    let arb = shape.act_row_bytes(at)?;
    let kernel = RowKernel::for_type(w.ty);
    let tile = kernel.tile(k, wrb, arb);
    // Decode (no full tile): the side kernel with per-row activation facts, where one exists.
    let side = kernel.side(k, wrb, arb).filter(|_| nt < TILE);
    let out = &mut out[..nt * m];
    with_scratch(|sc| {
        let fit = encode_activations(at, &x[..nt * k], k, arb, sc, tile.is_some(), threads)?;
        let side = side.filter(|_| sc.side.fill_rows(at, &sc.act, arb));
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
            tile: tile.filter(|_| fit).map(|f| (f, &sc.side)),
            side: side.map(|f| (f, &sc.side)),
            blocks,
            tile_blocks,
        };
        par_row_tasks(out, m, nt, Split::new(m, nt, threads), |o| task.run(o))
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
    /// The tile kernel (full tiles of prefill) with the side table it reads.
    tile: Option<(TileFn, &'a TileSide)>,
    /// The side kernel (decode) with the side table it reads.
    side: Option<(RowSideFn, &'a TileSide)>,
    /// Weight blocks per row, and per block range of the tile kernel.
    blocks: usize,
    tile_blocks: usize,
}

impl Task<'_> {
    fn w_row(&self, o: usize) -> &[u8] {
        &self.w[o * self.wrb..(o + 1) * self.wrb]
    }

    fn act_row(&self, t: usize) -> &[u8] {
        &self.act[t * self.arb..(t + 1) * self.arb]
    }

    /// Every (weight row, token) dot of the task's rows, tokens in tiles of [`TILE`].
    fn run(&self, out: &mut RowsOut) -> KResult<()> {
        for t0 in (0..self.nt).step_by(TILE) {
            let tokens = t0..(t0 + TILE).min(self.nt);
            match (self.tile, self.side) {
                (Some((f, side)), _) if tokens.len() == TILE => self.full_tile(f, side, t0, out),
                (_, Some((f, table))) => self.side_rows(f, table, tokens, out),
                _ => self.row_by_row(tokens, out)?,
            }
        }
        Ok(())
    }

    /// One full tile of tokens through the tile kernel.
    fn full_tile(&self, f: TileFn, side: &TileSide, t0: usize, out: &mut RowsOut) {
        let rows = out.rows();
        assert!(
            rows.len() <= ROWS_PER_TASK,
            "prefill tasks have {ROWS_PER_TASK} rows"
        );
        let acts = &self.act[t0 * self.arb..(t0 + TILE) * self.arb];
        let side = side.tile(t0 / TILE);
        // Blocks in ranges whose activations stay in L1 while every row of the task uses
        // them; each (row, token) still adds its blocks in order.
        let mut states = [TileAcc::default(); ROWS_PER_TASK];
        for b0 in (0..self.blocks).step_by(self.tile_blocks) {
            let range = b0..(b0 + self.tile_blocks).min(self.blocks);
            for (o, state) in rows.clone().zip(states.iter_mut()) {
                f(self.w_row(o), acts, self.arb, side, range.clone(), state);
            }
        }
        for (o, state) in rows.zip(&states) {
            for (i, v) in finish_tile(state).into_iter().enumerate() {
                out.set(t0 + i, o, v);
            }
        }
    }

    /// Decode: all of the task's rows per token in one call of the side kernel.
    fn side_rows(&self, f: RowSideFn, table: &TileSide, tokens: Range<usize>, out: &mut RowsOut) {
        let rows = out.rows();
        let wrs = &self.w[rows.start * self.wrb..rows.end * self.wrb];
        for t in tokens {
            let (d, sums) = table.row(t);
            f(wrs, self.act_row(t), d, sums, out.token(t));
        }
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
