//! The windowed families past classic and chunked flash: KV-split two-pass, flash prefill
//! with the tail pad, and three-pass (see `launch/window.rs` for the shared rules).

use super::window::{shape, Bufs, WindowAttn, WindowKind};
use super::{encode, need_len, to_u32, KvType};
use crate::device::{as_bytes, Arg, Device};
use crate::error::Result;
use crate::params::WindowAttnParams;

/// Tiles per prefill-flash wave: one tail-pad dispatch and one tile dispatch per wave, so the
/// tail pads (in the caller's scratch) and the tile table (constant bytes, 16 per tile) stay
/// bounded whatever the number of queries.
pub const PREFILL_WAVE_TILES: usize = 64;

/// Queries per prefill-flash tile.
pub const PREFILL_TILE_QUERIES: usize = 8;

/// Tail-pad bytes for `n_tiles` tiles: one wave's slots of 64 K rows then 64 V rows each.
pub(super) fn prefill_pad_bytes(s: &WindowAttn, n_tiles: usize) -> usize {
    let elem = match s.kv {
        KvType::F32 => 4,
        _ => 2,
    };
    n_tiles.min(PREFILL_WAVE_TILES) * 2 * 64 * s.n_head_kv * s.head_dim * elem
}

/// Pass 1 over the splits of every (query, head), then the in-order combine. Scratch: the
/// split outputs `[n_tokens][n_head][n_splits][head_dim]`, then their `(m, l)` pairs.
pub(super) fn split<D: Device>(
    dev: &D,
    s: &WindowAttn,
    b: &Bufs<'_, D::Buffer>,
    p: &WindowAttnParams,
    suffix: &str,
) -> Result<()> {
    const OP: &str = "attention_window (split)";
    let ml_off = (s.n_tokens * s.n_head * p.n_chunks as usize * s.head_dim * 4) as u64;
    encode(
        dev,
        &format!("kernel_split_window_{suffix}_hd{}", s.head_dim),
        [
            to_u32(OP, "split groups", (p.n_chunks as usize).div_ceil(4))?,
            p.n_head,
            p.n_tokens,
        ],
        [128, 1, 1],
        &[
            Arg::Buffer(b.q, b.q_off),
            Arg::Buffer(b.k, 0),
            Arg::Buffer(b.v, 0),
            Arg::Buffer(b.window, b.win_off),
            Arg::Buffer(b.scratch, 0),
            Arg::Buffer(b.scratch, ml_off),
            Arg::Bytes(as_bytes(p)),
        ],
        &[],
    )?;
    encode(
        dev,
        "kernel_split_window_combine",
        [p.n_head, p.n_tokens, 1],
        [128, 1, 1],
        &[
            Arg::Buffer(b.scratch, 0),
            Arg::Buffer(b.scratch, ml_off),
            Arg::Buffer(b.window, b.win_off),
            Arg::Buffer(b.out, b.out_off),
            Arg::Bytes(as_bytes(p)),
        ],
        &[],
    )
}

/// Scores into the scratch rows, masked softmax in place, then P * V.
pub(super) fn three_pass<D: Device>(
    dev: &D,
    b: &Bufs<'_, D::Buffer>,
    p: &WindowAttnParams,
    suffix: &str,
) -> Result<()> {
    const OP: &str = "attention_window (three-pass)";
    encode(
        dev,
        &format!("kernel_window_scores_{suffix}"),
        [
            to_u32(OP, "score groups", (p.row_stride as usize).div_ceil(128))?,
            p.n_head,
            p.n_tokens,
        ],
        [128, 1, 1],
        &[
            Arg::Buffer(b.q, b.q_off),
            Arg::Buffer(b.k, 0),
            Arg::Buffer(b.window, b.win_off),
            Arg::Buffer(b.scratch, 0),
            Arg::Bytes(as_bytes(p)),
        ],
        &[],
    )?;
    encode(
        dev,
        "kernel_window_softmax",
        [p.n_head, p.n_tokens, 1],
        [128, 1, 1],
        &[
            Arg::Buffer(b.scratch, 0),
            Arg::Buffer(b.window, b.win_off),
            Arg::Bytes(as_bytes(p)),
        ],
        &[],
    )?;
    encode(
        dev,
        &format!("kernel_window_pv_{suffix}"),
        [p.n_head, p.n_tokens, 1],
        [128, 1, 1],
        &[
            Arg::Buffer(b.scratch, 0),
            Arg::Buffer(b.v, 0),
            Arg::Buffer(b.window, b.win_off),
            Arg::Buffer(b.out, b.out_off),
            Arg::Bytes(as_bytes(p)),
        ],
        &[],
    )
}

/// A window as its mapping from logical rows to cells: the non-empty runs, contiguous ones
/// merged, so two windows map their common logical rows to the same cells exactly when the
/// shorter one's runs are the longer one's up to its length.
fn mapping(kind: WindowKind, w: &[i32]) -> Vec<(i64, i64)> {
    let mut runs: Vec<(i64, i64)> = Vec::new();
    let raw: Vec<(i64, i64)> = match kind {
        WindowKind::Span => vec![(w[0] as i64, (w[1] - w[0]) as i64)],
        WindowKind::Map => w
            .chunks_exact(2)
            .map(|r| (r[0] as i64, r[1] as i64))
            .collect(),
    };
    for (cell, n) in raw.into_iter().filter(|&(_, n)| n > 0) {
        match runs.last_mut() {
            Some(last) if last.0 + last.1 == cell => last.1 += n,
            _ => runs.push((cell, n)),
        }
    }
    runs
}

/// Whether `short` (no longer than `long`) maps its logical rows as `long` does.
fn is_prefix(short: &[(i64, i64)], long: &[(i64, i64)]) -> bool {
    let Some((last, head)) = short.split_last() else {
        return true;
    };
    if head.len() >= long.len() || head != &long[..head.len()] {
        return false;
    }
    let r = long[head.len()];
    last.0 == r.0 && last.1 <= r.1
}

/// Groups consecutive queries into tiles of up to [`PREFILL_TILE_QUERIES`] whose windows are
/// prefixes of the tile leader's (its longest): `[first query, count, leader, 0]` per tile.
pub fn prefill_tiles(kind: WindowKind, vals: &[i32], n_tokens: usize) -> Vec<[u32; 4]> {
    let width = kind.width();
    let maps: Vec<Vec<(i64, i64)>> = (0..n_tokens)
        .map(|t| mapping(kind, &vals[t * width..(t + 1) * width]))
        .collect();
    let len = |m: &[(i64, i64)]| m.iter().map(|r| r.1).sum::<i64>();
    let mut tiles = Vec::new();
    let mut t = 0;
    while t < n_tokens {
        let t0 = t;
        let mut leader = t;
        t += 1;
        while t < n_tokens && t - t0 < PREFILL_TILE_QUERIES {
            let (lead, next) = (&maps[leader], &maps[t]);
            if len(next) <= len(lead) {
                if !is_prefix(next, lead) {
                    break;
                }
            } else if is_prefix(lead, next) {
                leader = t;
            } else {
                break;
            }
            t += 1;
        }
        tiles.push([t0 as u32, (t - t0) as u32, leader as u32, 0]);
    }
    tiles
}

/// Tile waves: per wave, the tail pad of its tiles, then the tiles. The tile table goes as
/// constant bytes with each dispatch (copied at encode time), never through a host write
/// into a buffer: the scratch may still be read by earlier, unsubmitted commands.
pub(super) fn prefill<D: Device>(
    dev: &D,
    s: &WindowAttn,
    b: &Bufs<'_, D::Buffer>,
    p: &WindowAttnParams,
    suffix: &str,
    vals: &[i32],
) -> Result<()> {
    const OP: &str = "attention_window (prefill flash)";
    let tiles = prefill_tiles(s.window, vals, s.n_tokens);
    let pad_bytes = prefill_pad_bytes(s, tiles.len());
    need_len(dev, OP, "scratch", b.scratch, 0, pad_bytes as u64)?;
    let v_off = (pad_bytes / 2) as u64;
    if tiles.len() > u32::MAX as usize {
        return Err(shape(format!("{} tiles", tiles.len())));
    }
    for wave in tiles.chunks(PREFILL_WAVE_TILES) {
        let table: Vec<u8> = wave
            .iter()
            .flatten()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let mut pw = *p;
        pw.n_tiles = wave.len() as u32;
        encode(
            dev,
            &format!("kernel_window_tail_pad_{suffix}"),
            [64, pw.n_tiles, 1],
            [128, 1, 1],
            &[
                Arg::Buffer(b.k, 0),
                Arg::Buffer(b.v, 0),
                Arg::Buffer(b.scratch, 0),
                Arg::Buffer(b.scratch, v_off),
                Arg::Buffer(b.window, b.win_off),
                Arg::Bytes(&table),
                Arg::Bytes(as_bytes(&pw)),
            ],
            &[],
        )?;
        encode(
            dev,
            &format!("kernel_fa_window_prefill_{suffix}_hd{}", s.head_dim),
            [pw.n_tiles, pw.n_head, 1],
            [128, 1, 1],
            &[
                Arg::Buffer(b.q, b.q_off),
                Arg::Buffer(b.k, 0),
                Arg::Buffer(b.v, 0),
                Arg::Buffer(b.scratch, 0),
                Arg::Buffer(b.scratch, v_off),
                Arg::Buffer(b.window, b.win_off),
                Arg::Buffer(b.out, b.out_off),
                Arg::Bytes(&table),
                Arg::Bytes(as_bytes(&pw)),
            ],
            &[],
        )?;
    }
    Ok(())
}
