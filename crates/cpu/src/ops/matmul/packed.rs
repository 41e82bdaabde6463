//! Weight layouts other than plain rows, made once at load ([`crate::CpuBackend`]'s
//! `prepare_weights`) for the kernels that read them.
//!
//! [`Layout::Q4kX16`]: Q4_K rows interleaved 16 at a time, so that one SIMD lane holds one
//! weight row and a decode dot runs 16 rows as the lanes of one vector (the per-row scale
//! work, the horizontal sums and the float part are done once for 16 rows, and the weights
//! are one stream for the hardware prefetchers). Group g (rows 16g..16g + 16) and super-block
//! b occupy 2304 bytes at `(g · blocks + b) · 2304`:
//!
//! | bytes | what (row r = 0..16 of the group) |
//! |---|---|
//! | 0..32 | d of row r (f16) at 2r |
//! | 32..64 | dmin of row r (f16) at 32 + 2r |
//! | 64..128, 128..192, 192..256 | the row's 12 scale bytes as three words: bytes 0..4 at 64 + 4r, 4..8 at 128 + 4r, 8..12 at 192 + 4r |
//! | 256..2304 | `qs[4q..4q + 4]` of row r at 256 + 64q + 4r (q = 0..32) |
//!
//! [`Layout::Q6kX16`]: Q6_K the same way, 16 · 210 bytes per group and super-block:
//!
//! | bytes | what (row r = 0..16 of the group) |
//! |---|---|
//! | 0..32 | d of row r (f16) at 2r |
//! | 32..288 | the row's 16 i8 scales as four words: `scales[4w..4w + 4]` at 32 + 64w + 4r |
//! | 288..3360 | 16 triples of 192 bytes, in the order the kernel reads them: for half n = 0, 1 and j = 0..8, at 288 + 192 (8n + j): `ql[64n + 4j..][..4]`, `ql[64n + 32 + 4j..][..4]` and `qh[32n + 4j..][..4]` of every row (row r at 4r of each 64 bytes) |
//!
//! [`Layout::Q40X16`]: Q4_0, 16 · 18 bytes per group and 32-element block: d of row r (f16)
//! at 2r, then `qs[4q..4q + 4]` of row r at 32 + 64q + 4r (q = 0..4).
//!
//! [`Layout::Q80X16`]: Q8_0 likewise, 16 · 34 bytes per group and block: d of row r at 2r,
//! then `qs[4q..4q + 4]` of row r at 32 + 64q + 4r (q = 0..8).
//!
//! [`Layout::Q50X16`]: Q5_0, 16 · 22 bytes per group and block: d of row r at 2r, its `qh`
//! word at 32 + 4r, then `qs[4q..4q + 4]` of row r at 96 + 64q + 4r (q = 0..4).
//!
//! [`Layout::Q41X16`]: Q4_1, 16 · 20 bytes per group and block: d of row r at 2r, m at
//! 32 + 2r, then `qs[4q..4q + 4]` of row r at 64 + 64q + 4r (q = 0..4).
//!
//! A group takes exactly the bytes its 16 rows took, so rows past the last whole group keep
//! their plain layout at their plain offset (`o · wrb`).
//! Nothing is rounded or re-encoded: [`unpack_q4k_x16`] gives back the original bytes, and the
//! kernels compute each row's reference dot bit for bit.

use super::KResult;
use crate::huge::HugeBytes;
use crate::ops::KernelError;
use minfer_gguf::GgmlType;
use std::sync::OnceLock;

/// How a weight's bytes are laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// `m` rows of `k` elements, one after another (the GGUF layout).
    #[default]
    Rows,
    /// Q4_K in groups of 16 interleaved rows (this module's docs).
    Q4kX16,
    /// Q6_K in groups of 16 interleaved rows (this module's docs).
    Q6kX16,
    /// Q4_0 in groups of 16 interleaved rows (this module's docs).
    Q40X16,
    /// Q8_0 in groups of 16 interleaved rows (this module's docs).
    Q80X16,
    /// Q5_0 in groups of 16 interleaved rows (this module's docs).
    Q50X16,
    /// Q4_1 in groups of 16 interleaved rows (this module's docs).
    Q41X16,
}

impl Layout {
    /// The packed layout for weights of `ty`, where there is one.
    pub fn packed_for(ty: GgmlType) -> Option<Layout> {
        match ty {
            GgmlType::Q4K => Some(Layout::Q4kX16),
            GgmlType::Q6K => Some(Layout::Q6kX16),
            GgmlType::Q4_0 => Some(Layout::Q40X16),
            GgmlType::Q8_0 => Some(Layout::Q80X16),
            GgmlType::Q5_0 => Some(Layout::Q50X16),
            GgmlType::Q4_1 => Some(Layout::Q41X16),
            _ => None,
        }
    }

    /// The weight type a packed layout holds (None for plain rows).
    pub fn weight_type(self) -> Option<GgmlType> {
        match self {
            Layout::Rows => None,
            Layout::Q4kX16 => Some(GgmlType::Q4K),
            Layout::Q6kX16 => Some(GgmlType::Q6K),
            Layout::Q40X16 => Some(GgmlType::Q4_0),
            Layout::Q80X16 => Some(GgmlType::Q8_0),
            Layout::Q50X16 => Some(GgmlType::Q5_0),
            Layout::Q41X16 => Some(GgmlType::Q4_1),
        }
    }

    /// Bytes of one plain block, and the moves (plain offset, packed offset for row 0, length;
    /// row r's packed offset adds `4r` for 4-byte pieces, `2r` for 2-byte ones) of its
    /// pieces; built once per layout.
    fn pieces(self) -> &'static Pieces {
        static TABLES: [OnceLock<Pieces>; 7] = [const { OnceLock::new() }; 7];
        let i = match self {
            Layout::Rows => 0,
            Layout::Q4kX16 => 1,
            Layout::Q6kX16 => 2,
            Layout::Q40X16 => 3,
            Layout::Q80X16 => 4,
            Layout::Q50X16 => 5,
            Layout::Q41X16 => 6,
        };
        TABLES[i].get_or_init(|| self.build_pieces())
    }

    fn build_pieces(self) -> Pieces {
        let mut v = Vec::new();
        match self {
            Layout::Rows => (0, v),
            Layout::Q4kX16 => {
                v.push((0, 0, 2));
                v.push((2, 32, 2));
                v.extend((0..3).map(|w| (4 + 4 * w, 64 * (w + 1), 4)));
                v.extend((0..32).map(|q| (16 + 4 * q, 256 + 64 * q, 4)));
                (144, v)
            }
            Layout::Q6kX16 => {
                v.push((208, 0, 2));
                v.extend((0..4).map(|w| (192 + 4 * w, 32 + 64 * w, 4)));
                // In the kernel's reading order: per 128-element half n and quad j = 0..8,
                // the ql quads j and j + 8 of the half, then its qh quad j.
                let triple = |n: usize, j: usize| 288 + 192 * (8 * n + j);
                v.extend((0..32).map(|q| (4 * q, triple(q / 16, q % 8) + 64 * (q % 16 / 8), 4)));
                v.extend((0..16).map(|q| (128 + 4 * q, triple(q / 8, q % 8) + 128, 4)));
                (210, v)
            }
            Layout::Q40X16 => {
                v.push((0, 0, 2));
                v.extend((0..4).map(|q| (2 + 4 * q, 32 + 64 * q, 4)));
                (18, v)
            }
            Layout::Q80X16 => {
                v.push((0, 0, 2));
                v.extend((0..8).map(|q| (2 + 4 * q, 32 + 64 * q, 4)));
                (34, v)
            }
            Layout::Q50X16 => {
                v.push((0, 0, 2));
                v.push((2, 32, 4));
                v.extend((0..4).map(|q| (6 + 4 * q, 96 + 64 * q, 4)));
                (22, v)
            }
            Layout::Q41X16 => {
                v.push((0, 0, 2));
                v.push((2, 32, 2));
                v.extend((0..4).map(|q| (4 + 4 * q, 64 + 64 * q, 4)));
                (20, v)
            }
        }
    }
}

/// A layout's plain block bytes and its pieces' moves (`Layout::pieces`).
type Pieces = (usize, Vec<(usize, usize, usize)>);

/// Rows per interleaved group.
pub const X16: usize = 16;

/// The bytes of `m` rows of `k` elements (`src`, plain rows) in `layout` (a packed one), in a
/// buffer of huge pages (decode streams it; [`HugeBytes`]).
pub fn pack_x16(layout: Layout, src: &[u8], k: usize, m: usize) -> KResult<HugeBytes> {
    let (block, pieces) = layout.pieces();
    let block = *block;
    let ty = layout
        .weight_type()
        .ok_or_else(|| KernelError("plain rows are not a packed layout".into()))?;
    let elems = ty.block_size() as usize;
    if !k.is_multiple_of(elems) {
        return Err(KernelError(format!(
            "{k} is not a whole number of {ty} blocks"
        )));
    }
    let blocks = k / elems;
    let wrb = blocks * block;
    if src.len() != wrb * m {
        return Err(KernelError(format!(
            "{} bytes are not {m} {ty} rows of {k}",
            src.len()
        )));
    }
    let mut dst = HugeBytes::zeroed(src.len());
    let gb = X16 * block;
    let groups = m / X16;
    for g in 0..groups {
        // SAFETY: group g's plain rows are 16 · wrb bytes at g · 16 · wrb of `src` and its
        // packed bytes the same span of `dst` (the length checks above); every piece lies
        // inside a block on both sides (`pieces_tile_the_blocks`). Plain 2- and 4-byte moves:
        // a form of slices and `copy_from_slice` took ~1 s to pack the demo model.
        unsafe {
            let s = src.as_ptr().add(g * X16 * wrb);
            let d = dst.as_mut_ptr().add(g * X16 * wrb);
            for b in 0..blocks {
                let out = d.add(b * gb);
                for r in 0..X16 {
                    let blk = s.add(r * wrb + b * block);
                    for &(at, to, len) in pieces {
                        let (from, into) = (blk.add(at), out.add(to + len * r));
                        if len == 4 {
                            into.cast::<u32>()
                                .write_unaligned(from.cast::<u32>().read_unaligned());
                        } else {
                            into.cast::<u16>()
                                .write_unaligned(from.cast::<u16>().read_unaligned());
                        }
                    }
                }
            }
        }
    }
    let done = groups * X16 * wrb;
    dst[done..].copy_from_slice(&src[done..]);
    Ok(dst)
}

/// The 16 plain rows (`16 · wrb` bytes into `out`) of one group's packed bytes. Prefill runs
/// this once per 16-row chunk of every packed matmul, so the moves are plain 2- and 4-byte
/// loads and stores (a first form of slices and `copy_from_slice` cost the demo model's
/// pp512 12 %).
pub fn unpack_x16(layout: Layout, group: &[u8], blocks: usize, out: &mut [u8]) {
    let (block, pieces) = layout.pieces();
    let block = *block;
    let (wrb, gb) = (blocks * block, X16 * block);
    assert!(
        block > 0 && group.len() == blocks * gb && out.len() == X16 * wrb,
        "a {layout:?} group of {blocks} super-blocks"
    );
    for b in 0..blocks {
        // SAFETY: block b of the group is gb bytes at b · gb; row r's block b is `block`
        // bytes at r · wrb + b · block of `out` (the assertion). Every piece lies inside
        // both: to + len · 16 <= gb and at + len <= block (`pieces_tile_the_blocks`).
        unsafe {
            let g = group.as_ptr().add(b * gb);
            let o = out.as_mut_ptr().add(b * block);
            for &(at, to, len) in pieces {
                for r in 0..X16 {
                    let (src, dst) = (g.add(to + len * r), o.add(r * wrb + at));
                    if len == 4 {
                        dst.cast::<u32>()
                            .write_unaligned(src.cast::<u32>().read_unaligned());
                    } else {
                        dst.cast::<u16>()
                            .write_unaligned(src.cast::<u16>().read_unaligned());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_gguf::quants::random_blocks;

    const Q4K: usize = 144;
    const GROUP_BLOCK: usize = X16 * Q4K;

    #[test]
    fn packing_moves_every_byte_and_unpacking_restores_them() {
        let (k, m) = (512, 37);
        let src = random_blocks(GgmlType::Q4K, m * k / 256, 11);
        let packed = pack_x16(Layout::Q4kX16, &src, k, m).unwrap();
        assert_ne!(packed[..], src[..], "the groups are interleaved");
        let wrb = 2 * Q4K;
        // The rows past the two whole groups keep their bytes and offsets.
        assert_eq!(packed[32 * wrb..], src[32 * wrb..]);
        // Row 5 of group 1, super-block 1: d, a scale word and the last quad of qs.
        let blk = &src[(16 + 5) * wrb + Q4K..][..Q4K];
        let g = &packed[(2 + 1) * GROUP_BLOCK..][..GROUP_BLOCK];
        assert_eq!(&g[10..12], &blk[0..2]);
        assert_eq!(&g[128 + 20..128 + 24], &blk[8..12]);
        assert_eq!(&g[256 + 64 * 31 + 20..][..4], &blk[140..144]);
        let mut back = vec![0u8; X16 * wrb];
        for grp in 0..2 {
            unpack_x16(
                Layout::Q4kX16,
                &packed[grp * X16 * wrb..][..X16 * wrb],
                2,
                &mut back,
            );
            assert_eq!(back, src[grp * X16 * wrb..][..X16 * wrb]);
        }
    }

    #[test]
    fn pieces_tile_the_blocks() {
        // Every byte of a plain block is moved once, to a packed byte of its own: what
        // `unpack_x16`'s unchecked moves rely on.
        for layout in [
            Layout::Q4kX16,
            Layout::Q6kX16,
            Layout::Q40X16,
            Layout::Q80X16,
            Layout::Q50X16,
            Layout::Q41X16,
        ] {
            let (block, pieces) = layout.pieces();
            let mut plain = vec![0u8; *block];
            let mut packed = vec![0u8; X16 * block];
            for &(at, to, len) in pieces {
                assert!(len == 2 || len == 4, "{layout:?}");
                plain[at..at + len].iter_mut().for_each(|v| *v += 1);
                for r in 0..X16 {
                    packed[to + len * r..][..len]
                        .iter_mut()
                        .for_each(|v| *v += 1);
                }
            }
            assert!(plain.iter().all(|&v| v == 1), "{layout:?}");
            assert!(packed.iter().all(|&v| v == 1), "{layout:?}");
        }
    }

    #[test]
    fn q6_k_packing_round_trips() {
        let (k, m) = (768, 35);
        let src = random_blocks(GgmlType::Q6K, m * k / 256, 12);
        let packed = pack_x16(Layout::Q6kX16, &src, k, m).unwrap();
        let wrb = 3 * 210;
        // Row 3 of group 0, super-block 2: d, scale word 1, the last ql and qh quads.
        let blk = &src[3 * wrb + 2 * 210..][..210];
        let g = &packed[2 * X16 * 210..][..X16 * 210];
        assert_eq!(&g[6..8], &blk[208..210]);
        assert_eq!(&g[32 + 64 + 12..][..4], &blk[196..200]);
        // ql[124..128]: half 1, j = 7, the second quad of the triple; qh[60..64]: half 1,
        // j = 7, the third.
        assert_eq!(&g[288 + 192 * 15 + 64 + 12..][..4], &blk[124..128]);
        assert_eq!(&g[288 + 192 * 15 + 128 + 12..][..4], &blk[188..192]);
        let mut back = vec![0u8; X16 * wrb];
        for grp in 0..2 {
            unpack_x16(
                Layout::Q6kX16,
                &packed[grp * X16 * wrb..][..X16 * wrb],
                3,
                &mut back,
            );
            assert_eq!(back, src[grp * X16 * wrb..][..X16 * wrb]);
        }
        assert_eq!(packed[32 * wrb..], src[32 * wrb..]);
    }

    #[test]
    fn packing_refuses_bytes_that_are_not_whole_rows() {
        let src = vec![0u8; 144 * 3];
        assert!(pack_x16(Layout::Q4kX16, &src, 256, 4).is_err());
        assert!(pack_x16(Layout::Q4kX16, &src, 100, 3).is_err());
        assert!(pack_x16(Layout::Rows, &src, 256, 3).is_err());
    }
}
