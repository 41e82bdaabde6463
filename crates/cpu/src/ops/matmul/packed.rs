//! Weight layouts other than plain rows, made once at load ([`crate::CpuBackend`]'s
//! `prepare_weights`) for the kernels that read them.
//!
//! [`Layout::Q4kX16`]: Q4_K rows interleaved 16 at a time, so that one SIMD lane holds one
//! weight row and a decode dot runs 16 rows as the lanes of one vector (the per-row scale
//! work, the horizontal sums and the float part are done once for 16 rows, and the weights
//! are one stream for the hardware prefetchers). Group g (rows 16g..16g + 16) and super-block
//! b occupy [`GROUP_BLOCK`] bytes at `(g · blocks + b) · GROUP_BLOCK`:
//!
//! | bytes | what (row r = 0..16 of the group) |
//! |---|---|
//! | 0..32 | d of row r (f16) at 2r |
//! | 32..64 | dmin of row r (f16) at 32 + 2r |
//! | 64..128, 128..192, 192..256 | the row's 12 scale bytes as three words: bytes 0..4 at 64 + 4r, 4..8 at 128 + 4r, 8..12 at 192 + 4r |
//! | 256..2304 | `qs[4q..4q + 4]` of row r at 256 + 64q + 4r (q = 0..32) |
//!
//! The group takes exactly the bytes its 16 rows took (16 · 144 per super-block), so rows
//! past the last whole group keep their plain layout at their plain offset (`o · wrb`).
//! Nothing is rounded or re-encoded: [`unpack_q4k_x16`] gives back the original bytes, and the
//! kernels compute each row's reference dot bit for bit.

use super::KResult;
use crate::huge::HugeBytes;
use crate::ops::KernelError;

/// How a weight's bytes are laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// `m` rows of `k` elements, one after another (the GGUF layout).
    #[default]
    Rows,
    /// Q4_K in groups of 16 interleaved rows (this module's docs).
    Q4kX16,
}

/// Rows per interleaved group.
pub const X16: usize = 16;
/// Bytes of one Q4_K super-block.
const Q4K: usize = 144;
/// Bytes of one group's super-block (16 rows).
pub const GROUP_BLOCK: usize = X16 * Q4K;

/// The bytes of `m` Q4_K rows of `k` elements (`src`, plain rows) in [`Layout::Q4kX16`], in
/// a buffer of huge pages (decode streams it; [`HugeBytes`]).
pub fn pack_q4k_x16(src: &[u8], k: usize, m: usize) -> KResult<HugeBytes> {
    if !k.is_multiple_of(256) {
        return Err(KernelError(format!(
            "{k} is not a whole number of Q4_K blocks"
        )));
    }
    let blocks = k / 256;
    let wrb = blocks * Q4K;
    if src.len() != wrb * m {
        return Err(KernelError(format!(
            "{} bytes are not {m} Q4_K rows of {k}",
            src.len()
        )));
    }
    let mut dst = HugeBytes::zeroed(src.len());
    let groups = m / X16;
    for g in 0..groups {
        for b in 0..blocks {
            let out = &mut dst[(g * blocks + b) * GROUP_BLOCK..][..GROUP_BLOCK];
            for r in 0..X16 {
                let blk = &src[(g * X16 + r) * wrb + b * Q4K..][..Q4K];
                out[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
                out[32 + 2 * r..34 + 2 * r].copy_from_slice(&blk[2..4]);
                for word in 0..3 {
                    out[64 * (word + 1) + 4 * r..][..4]
                        .copy_from_slice(&blk[4 + 4 * word..8 + 4 * word]);
                }
                for q in 0..32 {
                    out[256 + 64 * q + 4 * r..][..4].copy_from_slice(&blk[16 + 4 * q..20 + 4 * q]);
                }
            }
        }
    }
    let done = groups * X16 * wrb;
    dst[done..].copy_from_slice(&src[done..]);
    Ok(dst)
}

/// The 16 plain rows (`16 · blocks · 144` bytes into `out`) of one group's packed bytes.
pub fn unpack_q4k_x16(group: &[u8], blocks: usize, out: &mut [u8]) {
    let wrb = blocks * Q4K;
    assert!(
        group.len() == blocks * GROUP_BLOCK && out.len() == X16 * wrb,
        "a Q4_K x16 group of {blocks} super-blocks"
    );
    for b in 0..blocks {
        let g = &group[b * GROUP_BLOCK..][..GROUP_BLOCK];
        for r in 0..X16 {
            let blk = &mut out[r * wrb + b * Q4K..][..Q4K];
            blk[0..2].copy_from_slice(&g[2 * r..2 * r + 2]);
            blk[2..4].copy_from_slice(&g[32 + 2 * r..34 + 2 * r]);
            for word in 0..3 {
                blk[4 + 4 * word..8 + 4 * word].copy_from_slice(&g[64 * (word + 1) + 4 * r..][..4]);
            }
            for q in 0..32 {
                blk[16 + 4 * q..20 + 4 * q].copy_from_slice(&g[256 + 64 * q + 4 * r..][..4]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_gguf::quants::random_blocks;
    use minfer_gguf::GgmlType;

    #[test]
    fn packing_moves_every_byte_and_unpacking_restores_them() {
        let (k, m) = (512, 37);
        let src = random_blocks(GgmlType::Q4K, m * k / 256, 11);
        let packed = pack_q4k_x16(&src, k, m).unwrap();
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
            unpack_q4k_x16(&packed[grp * X16 * wrb..][..X16 * wrb], 2, &mut back);
            assert_eq!(back, src[grp * X16 * wrb..][..X16 * wrb]);
        }
    }

    #[test]
    fn packing_refuses_bytes_that_are_not_whole_rows() {
        let src = vec![0u8; 144 * 3];
        assert!(pack_q4k_x16(&src, 256, 4).is_err());
        assert!(pack_q4k_x16(&src, 100, 3).is_err());
    }
}
