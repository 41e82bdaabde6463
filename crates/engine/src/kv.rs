//! KV cell operations on the engine's one sequence.
//!
//! The sequence is dense: cell `i` holds position `i` for every `i < n_past` (decode's
//! attention spans are `[0, pos]`). Every public operation keeps it so:
//!
//! - [`Engine::kv_move_cells`] copies `n` cells of every layer's K and V from `src` to `dst`
//!   with `memmove` semantics: chunks go in ascending order when `dst < src` and descending
//!   when `dst > src`, so a chunk never reads a cell an earlier chunk wrote ([`move_plan`]).
//!   It is a raw operation: what the cells mean afterwards is the caller's business.
//! - [`Engine::kv_shift_cells`] rotates the K rows of cells `[c0, c1)` by `delta` positions.
//!   RoPE is a rotation per pair, so `R(p + δ) = R(δ)·R(p)`: rotating a stored row by `δ`
//!   gives the row a fresh prefill at `p + δ` would store, up to f32 rounding of the
//!   composed angle (and, for F16, one more rounding to half). V has no position.
//! - [`Engine::kv_retain`] keeps some position ranges, compacts them to the front in
//!   ascending order (every destination is at or below its source, so ascending is safe)
//!   and shifts each by its displacement: the defragmentation that closes the holes
//!   removals leave. [`Engine::kv_remove`] is retain of what is around one range.
//!
//! Q8_0 cannot shift: rotating a row means re-quantizing every block, and the rounding
//! compounds with each shift; [`kv_can_shift`] says which types can.

use crate::engine::{Engine, KvAccess, Result};
use minfer_gguf::{quants, GgmlType};
use minfer_graph::{Backend, BackendId, KvRegion, RopeStyle};
use std::ops::Range;

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("a {ty} KV cache cannot shift positions (re-quantizing rotated K rows compounds rounding); only f32 and f16 can")]
    CannotShift { ty: GgmlType },
    #[error("{op}: cells {start}..{end} are outside the context of {n_ctx} cells")]
    OutOfContext {
        op: &'static str,
        start: usize,
        end: usize,
        n_ctx: usize,
    },
    #[error("{op}: positions {start}..{end} are not within the {n_past} positions held")]
    NotHeld {
        op: &'static str,
        start: usize,
        end: usize,
        n_past: usize,
    },
    #[error("kv_retain: ranges must be ascending and disjoint; {prev:?} is followed by {next:?}")]
    Unordered {
        prev: Range<usize>,
        next: Range<usize>,
    },
    #[error("layer {layer} has no KV region on backend {backend}")]
    NoRegion { layer: usize, backend: BackendId },
}

/// Whether a KV element type can shift positions (see the module docs).
pub fn kv_can_shift(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16)
}

/// Cells copied per backend read/write.
const CHUNK_CELLS: usize = 64;

/// The chunk copies `(src, dst, len)` that move `n` cells from `src` to `dst` like
/// `memmove`: when each chunk is read whole before it is written, no chunk reads a cell an
/// earlier chunk overwrote.
pub fn move_plan(src: usize, dst: usize, n: usize, chunk: usize) -> Vec<(usize, usize, usize)> {
    let chunk = chunk.max(1);
    let mut plan = Vec::with_capacity(n.div_ceil(chunk));
    if n == 0 || src == dst {
        return plan;
    }
    if dst < src {
        let mut off = 0;
        while off < n {
            let len = chunk.min(n - off);
            plan.push((src + off, dst + off, len));
            off += len;
        }
    } else {
        let mut end = n;
        while end > 0 {
            let len = chunk.min(end);
            plan.push((src + end - len, dst + end - len, len));
            end -= len;
        }
    }
    plan
}

fn backend_of(
    backends: &mut [Box<dyn Backend>],
    layer: usize,
    id: BackendId,
) -> Result<&mut Box<dyn Backend>> {
    backends
        .iter_mut()
        .find(|b| b.id() == id)
        .ok_or_else(|| KvError::NoRegion { layer, backend: id }.into())
}

impl KvAccess<'_> {
    pub(crate) fn cell_bytes(&self) -> usize {
        let n_embd_kv = (self.hp.head_count_kv * self.hp.head_dim) as u64;
        // Engine::load checked that a row is whole blocks of the cache type.
        self.cache_type.row_bytes(n_embd_kv).unwrap_or(0) as usize
    }

    /// Every layer's region, or None when no graph has run yet (nothing stored).
    pub(crate) fn regions(&self) -> Option<Vec<KvRegion>> {
        (0..self.hp.block_count)
            .map(|l| self.alloc.kv_region(l))
            .collect()
    }

    fn check_cells(&self, op: &'static str, start: usize, n: usize) -> Result<()> {
        if start + n > self.n_ctx {
            return Err(KvError::OutOfContext {
                op,
                start,
                end: start + n,
                n_ctx: self.n_ctx,
            }
            .into());
        }
        Ok(())
    }

    fn move_cells(&mut self, src: usize, dst: usize, n: usize) -> Result<()> {
        self.check_cells("kv_move_cells", src, n)?;
        self.check_cells("kv_move_cells", dst, n)?;
        let Some(regions) = self.regions() else {
            return Ok(());
        };
        let cb = self.cell_bytes();
        let plan = move_plan(src, dst, n, CHUNK_CELLS);
        let mut tmp = vec![0u8; CHUNK_CELLS.min(n) * cb];
        for (layer, r) in regions.iter().enumerate() {
            let be = backend_of(self.backends, layer, r.backend)?;
            for buf in [r.pair.k, r.pair.v] {
                for &(s, d, len) in &plan {
                    let t = &mut tmp[..len * cb];
                    be.read(buf, s * cb, t)?;
                    be.write(buf, d * cb, t)?;
                }
            }
        }
        Ok(())
    }

    fn shift_cells(&mut self, c0: usize, c1: usize, delta: i64) -> Result<()> {
        if c1 <= c0 || delta == 0 {
            return Ok(());
        }
        if !kv_can_shift(self.cache_type) {
            return Err(KvError::CannotShift {
                ty: self.cache_type,
            }
            .into());
        }
        self.check_cells("kv_shift_cells", c0, c1 - c0)?;
        let Some(regions) = self.regions() else {
            return Ok(());
        };
        let hp = self.hp;
        let n_embd_kv = hp.head_count_kv * hp.head_dim;
        let cb = self.cell_bytes();
        let params = minfer_cpu::ops::rope::RopeParams {
            style: match hp.arch.rope_style() {
                minfer_models::RopeStyle::Neox => RopeStyle::Neox,
                minfer_models::RopeStyle::Normal => RopeStyle::Normal,
            },
            n_head: hp.head_count_kv,
            head_dim: hp.head_dim,
            freq_base: hp.rope_freq_base,
            freq_scale: 1.0 / hp.rope_scale,
            fused: false,
        };
        let ty = self.cache_type;
        let conv = |e: minfer_gguf::Error| minfer_graph::Error::Kv {
            layer: 0,
            problem: format!("shift: {e}"),
        };
        let mut raw = vec![0u8; CHUNK_CELLS * cb];
        let mut rows = vec![0f32; CHUNK_CELLS * n_embd_kv];
        let mut rotated = vec![0f32; CHUNK_CELLS * n_embd_kv];
        // The rope kernel reads positions as i32 bits in f32 slots.
        let pos = vec![f32::from_bits(delta as i32 as u32); CHUNK_CELLS];
        for (layer, r) in regions.iter().enumerate() {
            let be = backend_of(self.backends, layer, r.backend)?;
            let mut c = c0;
            while c < c1 {
                let len = CHUNK_CELLS.min(c1 - c);
                let raw = &mut raw[..len * cb];
                be.read(r.pair.k, c * cb, raw)?;
                for (src, dst) in raw.chunks_exact(cb).zip(rows.chunks_exact_mut(n_embd_kv)) {
                    quants::dequantize_row(ty, src, dst).map_err(conv)?;
                }
                let n = len * n_embd_kv;
                minfer_cpu::ops::rope::rope(&params, &rows[..n], &pos[..len], &mut rotated[..n]);
                for (src, dst) in rotated[..n]
                    .chunks_exact(n_embd_kv)
                    .zip(raw.chunks_exact_mut(cb))
                {
                    quants::quantize_row(ty, src, dst).map_err(conv)?;
                }
                be.write(r.pair.k, c * cb, raw)?;
                c += len;
            }
        }
        Ok(())
    }
}

impl Engine {
    /// Copies `n` cells from `src` to `dst` in every layer's K and V (overlap-safe; see the
    /// module docs). Positions held are unchanged: this is the raw primitive.
    pub fn kv_move_cells(&mut self, src: usize, dst: usize, n: usize) -> Result<()> {
        self.kv_access().move_cells(src, dst, n)
    }

    /// Rotates the K rows of cells `[c0, c1)` by `delta` positions (raw primitive).
    pub fn kv_shift_cells(&mut self, c0: usize, c1: usize, delta: i64) -> Result<()> {
        self.kv_access().shift_cells(c0, c1, delta)
    }

    /// Keeps the positions in `ranges` (ascending, disjoint, within what is held), moves
    /// them to the front and shifts each to its new position. Everything is checked before
    /// any cell changes.
    pub fn kv_retain(&mut self, ranges: &[Range<usize>]) -> Result<()> {
        let mut acc = self.kv_access();
        let n_past = *acc.n_past;
        let ranges: Vec<Range<usize>> = ranges.iter().filter(|r| !r.is_empty()).cloned().collect();
        for (i, r) in ranges.iter().enumerate() {
            if r.end > n_past {
                return Err(KvError::NotHeld {
                    op: "kv_retain",
                    start: r.start,
                    end: r.end,
                    n_past,
                }
                .into());
            }
            if i > 0 && ranges[i - 1].end > r.start {
                return Err(KvError::Unordered {
                    prev: ranges[i - 1].clone(),
                    next: r.clone(),
                }
                .into());
            }
        }
        let mut dst = 0;
        let moves = ranges.iter().any(|r| {
            let moved = r.start != dst;
            dst += r.len();
            moved
        });
        if moves && !kv_can_shift(acc.cache_type) {
            return Err(KvError::CannotShift { ty: acc.cache_type }.into());
        }
        let mut dst = 0;
        for r in &ranges {
            if r.start != dst {
                acc.move_cells(r.start, dst, r.len())?;
                acc.shift_cells(dst, dst + r.len(), dst as i64 - r.start as i64)?;
            }
            dst += r.len();
        }
        *acc.n_past = dst;
        Ok(())
    }

    /// Removes positions `[p0, p1)`; later positions move down by `p1 - p0` (K re-RoPEd).
    pub fn kv_remove(&mut self, p0: usize, p1: usize) -> Result<()> {
        let n = self.n_past();
        if p0 > p1 || p1 > n {
            return Err(KvError::NotHeld {
                op: "kv_remove",
                start: p0,
                end: p1,
                n_past: n,
            }
            .into());
        }
        self.kv_retain(&[0..p0, p1..n])
    }
}

#[cfg(test)]
mod tests {
    use super::move_plan;

    /// The plan, each chunk read whole then written, equals `copy_within` (memmove).
    /// Control: reversing the chunk order of an overlapping move fails this.
    #[test]
    fn move_plan_is_memmove() {
        for n_cells in [1usize, 5, 9] {
            for src in 0..n_cells {
                for dst in 0..n_cells {
                    for n in 0..=(n_cells - src.max(dst)) {
                        for chunk in [1, 2, 3, 64] {
                            let orig: Vec<u32> = (0..n_cells as u32).map(|i| i * 7 + 1).collect();
                            let mut want = orig.clone();
                            want.copy_within(src..src + n, dst);
                            let mut got = orig.clone();
                            for (s, d, len) in move_plan(src, dst, n, chunk) {
                                let tmp: Vec<u32> = got[s..s + len].to_vec();
                                got[d..d + len].copy_from_slice(&tmp);
                            }
                            assert_eq!(got, want, "src {src} dst {dst} n {n} chunk {chunk}");
                        }
                    }
                }
            }
        }
    }
}
