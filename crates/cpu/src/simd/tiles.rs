//! Multi-token ("tile") dot kernels for prefill: one weight row against [`TILE`] activation
//! rows at once. Each weight block is unpacked once per tile instead of once per token, and
//! the float part runs with one token per f32 lane, so a block's value for 8 tokens costs
//! one vector multiply-add chain instead of 8 scalar ones.
//!
//! Every token's result is bit-identical to the single-row kernel (and so to the scalar
//! reference of `minfer_gguf::quants`): the integer sums are the same integers (rewritten
//! exactly, e.g. Σ (q - 16)·a = Σ q·a - 16·Σ a), each block value is the reference's f32
//! expression with the same operands and association (no FMA), and block b adds into lane
//! b % 4 of the token's accumulator, combined as (0 + 2) + (1 + 3). Gate:
//! `tests/split_exact.rs` (matmul through the tiles vs the reference dot per (row, token)).
//!
//! The kernels read per-block activation facts (scales as f32, block sums) from a side table
//! that [`TileSide::fill`] fills once per matmul for all tokens, so the kernels do no f16
//! conversions of activations and no per-token integer reductions of them. `fill` also checks
//! the facts the integer rewrites rely on (no -128 quants where a sign is moved onto the
//! activation; Q8_K block sums equal to the sums of their quants): activations that fail them
//! (never the case for rows from [`crate::simd::quantize_act`]) get no tile, and the matmul
//! uses the single-row kernels for them instead.

use minfer_gguf::{quants, GgmlType};
use std::ops::Range;

/// Tokens per tile kernel call.
pub const TILE: usize = 8;

/// `(weight row, TILE activation rows of `arb` bytes each back to back, side table of this
/// tile, blocks, state)`: adds blocks `range` of the row's dot with each of the TILE rows
/// into `state` (block b into lane b % 4 of every token). A matmul walks a row's blocks in
/// ranges (so that a range of activations stays in L1 for many weight rows) and ends with
/// [`finish`]. The safe wrappers check every length (a wrong one is a panic: a programming
/// error, never user data).
pub type TileFn = fn(&[u8], &[u8], usize, TileSlice<'_>, Range<usize>, &mut TileAcc);

/// A [`TileFn`] for two tiles at once: `(weight row, [the TILE activation rows of each
/// tile], arb, [each tile's side table], blocks, [each tile's state])`, each tile's results
/// bit-identical to the [`TileFn`] of the same type; what depends on the weight alone is done
/// once for both.
pub type TilePairFn =
    fn(&[u8], [&[u8]; 2], usize, [TileSlice<'_>; 2], Range<usize>, &mut [TileAcc; 2]);

/// `(weight rows, activation row, fs, is, out)`: a ("side") kernel for decode that dots
/// `out.len()` consecutive weight rows (`w` split evenly among them) with one activation
/// row, reading its per-block facts from the side table ([`TileSide::row`]) instead of
/// deriving them per weight row, and writes `out[r]` = dot of row r. The facts: for Q8_0
/// activations `fs` = the scales as f32, `is` = Σ q per block; for Q8_1 `fs` = the blocks' d
/// then their s (2 x blocks), `is` empty; for Q8_K `fs` = the blocks' d, `is` empty. Several
/// rows per call keep the per-row work (call,
/// slicing, checks) out of the matmul's loop. Each dot is bit-identical to the
/// [`super::DotFn`] of the same type.
pub type RowSideFn = fn(&[u8], &[u8], &[f32], &[i32], &mut [f32]);

/// The reference's 4 block lanes (`quants::BLOCK_LANES`) of each of TILE tokens.
pub type TileAcc = [[f32; TILE]; 4];

/// The dots of a finished [`TileAcc`]: (lane 0 + lane 2) + (lane 1 + lane 3) per token.
pub fn finish(acc: &TileAcc) -> [f32; TILE] {
    std::array::from_fn(|t| (acc[0][t] + acc[2][t]) + (acc[1][t] + acc[3][t]))
}

/// The side table of one tile: `fs` f32 facts and `is` i32 facts, `[block][fact][TILE]`;
/// for Q8_0 activations also `iq`, the tile's quants interleaved by 4
/// (`[block][group of 4 elements][token][4]`, [`IQ_BLOCK`] bytes per block), so that one
/// 32-byte load holds the same 4 elements of all TILE tokens; for Q8_K activations `iq`
/// interleaved by 8 ([`IQ8K_BLOCK`] bytes per super-block) and `is` the sums of the
/// 32-element sub-blocks in pairs (fact p of a super-block: sub-block 2p's sum in the low
/// i16, 2p + 1's in the high one); empty for other types.
#[derive(Clone, Copy)]
pub struct TileSlice<'a> {
    pub fs: &'a [f32],
    pub is: &'a [i32],
    pub iq: &'a [u8],
}

/// Interleaved quant bytes per 32-element block of a tile: 32 elements of TILE tokens.
pub const IQ_BLOCK: usize = 32 * TILE;

/// Interleaved quant bytes per 256-element Q8_K super-block of a tile: its 32 runs of 8
/// elements, each run of all TILE tokens together (`[run][token][8]`), so that one 64-byte
/// load holds the same 8 elements of every token.
pub const IQ8K_BLOCK: usize = 256 * TILE;

/// One tile's side table, to fill.
pub struct TileMut<'a> {
    pub fs: &'a mut [f32],
    pub is: &'a mut [i32],
    pub iq: &'a mut [u8],
}

/// Per-block activation facts of every full tile of a matmul's activations.
#[derive(Default)]
pub struct TileSide {
    fs: Vec<f32>,
    is: Vec<i32>,
    iq: Vec<u8>,
    /// f32 / i32 facts and interleaved quant bytes per tile.
    fs_per_tile: usize,
    is_per_tile: usize,
    iq_per_tile: usize,
    /// Per-row facts of every activation row for the side kernels ([`RowSideFn`]): per
    /// row `row_nf` runs of `row_blocks` f32 facts and `row_ni` runs of i32 ones.
    row_fs: Vec<f32>,
    row_is: Vec<i32>,
    row_blocks: usize,
    row_nf: usize,
    row_ni: usize,
}

/// The side-table geometry of activation type `at` for rows of `blocks` blocks:
/// (f32 facts per block, i32 facts per block), each fact TILE lanes wide.
fn facts(at: GgmlType) -> Option<(usize, usize)> {
    match at {
        // d; Σ q
        GgmlType::Q8_0 => Some((1, 1)),
        // d, s
        GgmlType::Q8_1 => Some((2, 0)),
        // d; the sub-block sums, two per i32
        GgmlType::Q8K => Some((1, 4)),
        _ => None,
    }
}

impl TileSide {
    /// Sizes the table for the `nt / TILE` full tiles of `nt` activation rows of `arb` bytes
    /// encoded in `at`; false when `at` has no tile kernels or `arb` is not whole blocks.
    /// Then every tile is filled with [`TileSide::fill`] through [`TileSide::tiles_mut`].
    pub fn reset(&mut self, at: GgmlType, arb: usize, nt: usize) -> bool {
        let Some((nf, ni)) = facts(at) else {
            return false;
        };
        let bb = at.block_geometry().1 as usize;
        if !arb.is_multiple_of(bb) {
            return false;
        }
        let nb = arb / bb;
        let tiles = nt / TILE;
        self.fs_per_tile = nb * nf * TILE;
        // At least one (unused) i32 per tile, so that tiles stay chunks of equal length.
        self.is_per_tile = (nb * ni * TILE).max(1);
        self.iq_per_tile = match at {
            GgmlType::Q8_0 => nb * IQ_BLOCK,
            GgmlType::Q8K => nb * IQ8K_BLOCK,
            _ => 1,
        };
        self.fs.clear();
        self.fs.resize(tiles * self.fs_per_tile, 0.0);
        self.is.clear();
        self.is.resize(tiles * self.is_per_tile, 0);
        self.iq.clear();
        self.iq.resize(tiles * self.iq_per_tile, 0);
        true
    }

    /// The (f32, i32, interleaved quant) facts of every tile, to fill (one tile per item).
    pub fn tiles_mut(&mut self) -> impl Iterator<Item = TileMut<'_>> {
        self.fs
            .chunks_exact_mut(self.fs_per_tile)
            .zip(self.is.chunks_exact_mut(self.is_per_tile))
            .zip(self.iq.chunks_exact_mut(self.iq_per_tile))
            .map(|((fs, is), iq)| TileMut { fs, is, iq })
    }

    /// Fills one tile's facts from its TILE activation rows (`rows`, `arb` bytes each,
    /// encoded in `at`). False when the rows are not fit for the tile kernels (module doc).
    pub fn fill(at: GgmlType, rows: &[u8], arb: usize, side: &mut TileMut) -> bool {
        let TileMut { fs, is, iq } = side;
        let bb = at.block_geometry().1 as usize;
        let f16 = |b: &[u8], o: usize| quants::f16_to_f32(u16::from_le_bytes([b[o], b[o + 1]]));
        for t in 0..TILE {
            let row = &rows[t * arb..][..arb];
            for (b, blk) in row.chunks_exact(bb).enumerate() {
                match at {
                    GgmlType::Q8_0 => {
                        fs[b * TILE + t] = f16(blk, 0);
                        let q = &blk[2..34];
                        // The Q8_0-weight tile moves the weight's sign onto the activation.
                        if q.contains(&0x80) {
                            return false;
                        }
                        is[b * TILE + t] = q.iter().map(|&v| v as i8 as i32).sum();
                        for (g, four) in q.chunks_exact(4).enumerate() {
                            iq[b * IQ_BLOCK + g * 4 * TILE + 4 * t..][..4].copy_from_slice(four);
                        }
                    }
                    GgmlType::Q8_1 => {
                        fs[(2 * b) * TILE + t] = f16(blk, 0);
                        fs[(2 * b + 1) * TILE + t] = f16(blk, 2);
                    }
                    GgmlType::Q8K => {
                        fs[b * TILE + t] = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
                        // Q6_K's tile uses the block sums to remove its offset of 32.
                        let mut bsums = [0i32; 16];
                        for (j, bs) in bsums.iter_mut().enumerate() {
                            let sum: i32 = blk[4 + 16 * j..][..16]
                                .iter()
                                .map(|&v| v as i8 as i32)
                                .sum();
                            let stored = i16::from_le_bytes([blk[260 + 2 * j], blk[261 + 2 * j]]);
                            if sum != stored as i32 {
                                return false;
                            }
                            *bs = sum;
                        }
                        // Sub-block sums (|sum| <= 32 · 128, an i16) in pairs, for Q4_K's mins.
                        for p in 0..4 {
                            let s = |i: usize| (bsums[2 * i] + bsums[2 * i + 1]) as i16 as u16;
                            let pair = s(2 * p) as u32 | (s(2 * p + 1) as u32) << 16;
                            is[(b * 4 + p) * TILE + t] = pair as i32;
                        }
                        for (r, run) in blk[4..260].chunks_exact(8).enumerate() {
                            iq[b * IQ8K_BLOCK + r * 8 * TILE + 8 * t..][..8].copy_from_slice(run);
                        }
                    }
                    _ => return false,
                }
            }
        }
        true
    }

    /// Fills the per-row facts of the `arb`-byte activation rows `act` encoded in `at` for the
    /// side kernels ([`RowSideFn`] says which); false (nothing to use) when `at` is not Q8_0,
    /// Q8_1 or Q8_K or `arb` is not whole blocks. The facts hold for any bytes (no sign
    /// moves onto the activation), so there is nothing to check beyond the geometry.
    pub fn fill_rows(&mut self, at: GgmlType, act: &[u8], arb: usize) -> bool {
        let (bb, nf, ni) = match at {
            GgmlType::Q8_0 => (34, 1, 1),
            GgmlType::Q8_1 => (36, 2, 0),
            GgmlType::Q8K => (292, 1, 0),
            _ => return false,
        };
        if arb == 0 || !arb.is_multiple_of(bb) {
            return false;
        }
        let f16 = |b: &[u8], o: usize| quants::f16_to_f32(u16::from_le_bytes([b[o], b[o + 1]]));
        self.row_blocks = arb / bb;
        (self.row_nf, self.row_ni) = (nf, ni);
        self.row_fs.clear();
        self.row_is.clear();
        for row in act.chunks_exact(arb) {
            let blocks = || row.chunks_exact(bb);
            if at == GgmlType::Q8K {
                let d = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                self.row_fs.extend(blocks().map(d));
                continue;
            }
            self.row_fs.extend(blocks().map(|b| f16(b, 0)));
            if at == GgmlType::Q8_0 {
                let sum = |b: &[u8]| b[2..34].iter().map(|&v| v as i8 as i32).sum::<i32>();
                self.row_is.extend(blocks().map(sum));
            } else {
                self.row_fs.extend(blocks().map(|b| f16(b, 2)));
            }
        }
        true
    }

    /// The facts of activation row `t` ([`TileSide::fill_rows`] succeeded): (fs, is).
    pub fn row(&self, t: usize) -> (&[f32], &[i32]) {
        let (nf, ni) = (self.row_nf * self.row_blocks, self.row_ni * self.row_blocks);
        (&self.row_fs[t * nf..][..nf], &self.row_is[t * ni..][..ni])
    }

    /// The table of tile `tile` (all tiles filled successfully).
    pub fn tile(&self, tile: usize) -> TileSlice<'_> {
        TileSlice {
            fs: &self.fs[tile * self.fs_per_tile..][..self.fs_per_tile],
            is: &self.is[tile * self.is_per_tile..][..self.is_per_tile],
            iq: &self.iq[tile * self.iq_per_tile..][..self.iq_per_tile],
        }
    }
}

impl super::RowDot {
    /// The side kernel ([`RowSideFn`]) for rows of `n` elements of `w_len` weight and
    /// `act_len` activation bytes, where this type has one on this instruction set.
    pub fn side_for(&self, n: usize, w_len: usize, act_len: usize) -> Option<RowSideFn> {
        self.kernel_for(n, w_len, act_len)?;
        #[cfg(target_arch = "x86_64")]
        {
            if self.isa == super::Isa::Avx512Vnni {
                if let Some(f) = super::x86::avx512_side(self.ty) {
                    return Some(f);
                }
            }
            if avx2_kernels_run(self.isa) {
                return super::x86::avx2_side(self.ty);
            }
        }
        None
    }

    /// The tile kernel for rows of `n` elements of `w_len` weight and `act_len` activation
    /// bytes, where this type has one on this instruction set and the rows fit it.
    pub fn tile_for(&self, n: usize, w_len: usize, act_len: usize) -> Option<TileFn> {
        self.kernel_for(n, w_len, act_len)?;
        self.tile_kernel().map(|(_, f)| f)
    }

    /// The two-tile kernel ([`TilePairFn`]) for rows as [`RowDot::tile_for`]'s, where this type
    /// has one on this instruction set (AVX-512 VNNI: Q5_0, Q8_0, Q4_K).
    pub fn tile_pair_for(&self, n: usize, w_len: usize, act_len: usize) -> Option<TilePairFn> {
        self.kernel_for(n, w_len, act_len)?;
        #[cfg(target_arch = "x86_64")]
        if self.isa == super::Isa::Avx512Vnni {
            return super::x86::avx512_tile_pair(self.ty);
        }
        None
    }

    /// The instruction set whose tile kernel serves this dot's weight type, where there is
    /// one: AVX-512 VNNI's own tile where it has one (Q5_0, Q8_0, Q4_K, Q6_K), else the AVX2
    /// tile (on AVX2 machines, and for the other types on AVX-512 ones).
    pub fn tile_served_by(&self) -> Option<super::Isa> {
        self.tile_kernel().map(|(isa, _)| isa)
    }

    fn tile_kernel(&self) -> Option<(super::Isa, TileFn)> {
        #[cfg(target_arch = "x86_64")]
        {
            if self.isa == super::Isa::Avx512Vnni {
                if let Some(f) = super::x86::avx512_tile(self.ty) {
                    return Some((super::Isa::Avx512Vnni, f));
                }
            }
            if avx2_kernels_run(self.isa) {
                return super::x86::avx2_tile(self.ty).map(|f| (super::Isa::Avx2, f));
            }
        }
        None
    }
}

/// Whether the AVX2 tile and side kernels serve rows of `isa`'s dots: on AVX2, and on AVX-512
/// machines (which run AVX2 code too) for the types without an AVX-512 tile kernel and for
/// every side kernel (no AVX-512 side kernel exists). Every kernel gives
/// the scalar reference's bits (`tests/split_exact.rs`, `simd_exact.rs`), so mixing the AVX2
/// tiles with AVX-512 single-row dots changes no result.
#[cfg(target_arch = "x86_64")]
fn avx2_kernels_run(isa: super::Isa) -> bool {
    match isa {
        super::Isa::Avx2 => true,
        super::Isa::Avx512Vnni => crate::cpu_features::avx2_f16c(),
        _ => false,
    }
}
