//! Weight layouts other than plain rows, made once per weight (chosen by
//! [`crate::CpuBackend`]'s `prepare_weights`, made when a matmul first reads the weight) for
//! the kernels that read them.
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
use crate::threads;
use minfer_gguf::GgmlType;

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

    /// Bytes of one plain block, and the moves (plain offset, packed offset for row 0, length)
    /// of its pieces: row r's packed offset adds `len · r`.
    #[cfg(test)]
    fn pieces(self) -> (usize, Vec<(usize, usize, usize)>) {
        fn of<M: Moves>() -> (usize, Vec<(usize, usize, usize)>) {
            let two = M::TWO.iter().map(|&(at, to)| (at, to, 2));
            let four = M::FOUR.iter().map(|&(at, to)| (at, to, 4));
            (M::BLOCK, two.chain(four).collect())
        }
        match self {
            Layout::Rows => (0, Vec::new()),
            Layout::Q4kX16 => of::<Q4k>(),
            Layout::Q6kX16 => of::<Q6k>(),
            Layout::Q40X16 => of::<Q40>(),
            Layout::Q80X16 => of::<Q80>(),
            Layout::Q50X16 => of::<Q50>(),
            Layout::Q41X16 => of::<Q41>(),
        }
    }
}

/// A packed layout's moves as constants, split by width, so that each layout's packing and
/// unpacking loops are compiled with the offsets in the instructions and no branch (a table
/// read at run time cost the demo model's load ~0.35 s).
trait Moves {
    /// Bytes of one plain block.
    const BLOCK: usize;
    /// 2-byte pieces: (plain offset, packed offset of row 0; row r at + 2r).
    const TWO: &'static [(usize, usize)];
    /// 4-byte pieces: (plain offset, packed offset of row 0; row r at + 4r).
    const FOUR: &'static [(usize, usize)];
}

struct Q4k;
struct Q6k;
struct Q40;
struct Q80;
struct Q50;
struct Q41;

/// `N` 4-byte pieces from plain offset `at` on, to `to + step · i`.
const fn quads<const N: usize>(at: usize, to: usize, step: usize) -> [(usize, usize); N] {
    let mut a = [(0, 0); N];
    let mut i = 0;
    while i < N {
        a[i] = (at + 4 * i, to + step * i);
        i += 1;
    }
    a
}

/// Q4_K: the three scale words, then the 32 quant quads.
const fn q4k_four() -> [(usize, usize); 35] {
    let mut a = [(0, 0); 35];
    let mut w = 0;
    while w < 3 {
        a[w] = (4 + 4 * w, 64 * (w + 1));
        w += 1;
    }
    let mut q = 0;
    while q < 32 {
        a[3 + q] = (16 + 4 * q, 256 + 64 * q);
        q += 1;
    }
    a
}

/// Q6_K: the four scale words, then `ql` and `qh` in the kernel's reading order (per
/// 128-element half n and quad j = 0..8: the ql quads j and j + 8 of the half, then its qh
/// quad j, as one 192-byte triple).
const fn q6k_four() -> [(usize, usize); 52] {
    const fn triple(n: usize, j: usize) -> usize {
        288 + 192 * (8 * n + j)
    }
    let mut a = [(0, 0); 52];
    let mut w = 0;
    while w < 4 {
        a[w] = (192 + 4 * w, 32 + 64 * w);
        w += 1;
    }
    let mut q = 0;
    while q < 32 {
        a[4 + q] = (4 * q, triple(q / 16, q % 8) + 64 * (q % 16 / 8));
        q += 1;
    }
    let mut q = 0;
    while q < 16 {
        a[36 + q] = (128 + 4 * q, triple(q / 8, q % 8) + 128);
        q += 1;
    }
    a
}

/// Q5_0: the qh word, then the 4 quant quads.
const fn q50_four() -> [(usize, usize); 5] {
    let q = quads::<4>(6, 96, 64);
    [(2, 32), q[0], q[1], q[2], q[3]]
}

const Q4K_FOUR: [(usize, usize); 35] = q4k_four();
const Q6K_FOUR: [(usize, usize); 52] = q6k_four();
const Q40_FOUR: [(usize, usize); 4] = quads(2, 32, 64);
const Q80_FOUR: [(usize, usize); 8] = quads(2, 32, 64);
const Q50_FOUR: [(usize, usize); 5] = q50_four();
const Q41_FOUR: [(usize, usize); 4] = quads(4, 64, 64);

impl Moves for Q4k {
    const BLOCK: usize = 144;
    const TWO: &'static [(usize, usize)] = &[(0, 0), (2, 32)];
    const FOUR: &'static [(usize, usize)] = &Q4K_FOUR;
}
impl Moves for Q6k {
    const BLOCK: usize = 210;
    const TWO: &'static [(usize, usize)] = &[(208, 0)];
    const FOUR: &'static [(usize, usize)] = &Q6K_FOUR;
}
impl Moves for Q40 {
    const BLOCK: usize = 18;
    const TWO: &'static [(usize, usize)] = &[(0, 0)];
    const FOUR: &'static [(usize, usize)] = &Q40_FOUR;
}
impl Moves for Q80 {
    const BLOCK: usize = 34;
    const TWO: &'static [(usize, usize)] = &[(0, 0)];
    const FOUR: &'static [(usize, usize)] = &Q80_FOUR;
}
impl Moves for Q50 {
    const BLOCK: usize = 22;
    const TWO: &'static [(usize, usize)] = &[(0, 0)];
    const FOUR: &'static [(usize, usize)] = &Q50_FOUR;
}
impl Moves for Q41 {
    const BLOCK: usize = 20;
    const TWO: &'static [(usize, usize)] = &[(0, 0), (2, 32)];
    const FOUR: &'static [(usize, usize)] = &Q41_FOUR;
}

/// Calls `$f::<M>($args)` with `M` the moves of `$layout` (a packed one; plain rows go to
/// `$rows`).
macro_rules! by_layout {
    ($layout:expr, $rows:expr, $f:ident($($arg:expr),*)) => {
        match $layout {
            Layout::Rows => $rows,
            Layout::Q4kX16 => $f::<Q4k>($($arg),*),
            Layout::Q6kX16 => $f::<Q6k>($($arg),*),
            Layout::Q40X16 => $f::<Q40>($($arg),*),
            Layout::Q80X16 => $f::<Q80>($($arg),*),
            Layout::Q50X16 => $f::<Q50>($($arg),*),
            Layout::Q41X16 => $f::<Q41>($($arg),*),
        }
    };
}

/// Rows per interleaved group.
pub const X16: usize = 16;

/// The bytes of `m` rows of `k` elements (`src`, plain rows) in `layout` (a packed one), in a
/// buffer of huge pages (decode streams it; [`HugeBytes`]). One thread; [`pack_x16_on`]
/// shares the groups out.
pub fn pack_x16(layout: Layout, src: &[u8], k: usize, m: usize) -> KResult<HugeBytes> {
    pack_x16_on(layout, src, k, m, 1, false)
}

/// [`pack_x16`] with the groups shared out over `threads` threads of the pool (the bytes are
/// the same for any count). `release_src`: `src` lies in a read-only file mapping, whose
/// pages each task drops from the resident set once it has packed them
/// ([`crate::huge::release_mapped`]), so a large matrix is not resident twice while it packs.
pub fn pack_x16_on(
    layout: Layout,
    src: &[u8],
    k: usize,
    m: usize,
    threads: usize,
    release_src: bool,
) -> KResult<HugeBytes> {
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
    let block = ty.type_size() as usize;
    let wrb = blocks * block;
    if src.len() != wrb * m {
        return Err(KernelError(format!(
            "{} bytes are not {m} {ty} rows of {k}",
            src.len()
        )));
    }
    let mut dst = HugeBytes::zeroed(src.len());
    let groups = m / X16;
    let (s, d) = (src.as_ptr() as usize, dst.as_mut_ptr() as usize);
    // Ranges of whole groups a task, each group 16 · wrb bytes at the same offset of both.
    let per_task = (1 << 20) / (X16 * wrb).max(1) + 1;
    threads::par_tasks(groups.div_ceil(per_task), threads, |t| {
        let (g0, g1) = (t * per_task, ((t + 1) * per_task).min(groups));
        for g in g0..g1 {
            let at = g * X16 * wrb;
            // SAFETY: group g's plain rows are 16 · wrb bytes at `at` of `src` and its packed
            // bytes the same span of `dst` (the length checks above; `block` is the layout's
            // `Moves::BLOCK`, checked in `pack_group`); tasks hold disjoint groups.
            unsafe {
                by_layout!(
                    layout,
                    (),
                    pack_group((s + at) as *const u8, (d + at) as *mut u8, blocks, block)
                )
            }
        }
        if release_src {
            crate::huge::release_mapped(&src[g0 * X16 * wrb..g1 * X16 * wrb]);
        }
    });
    let done = groups * X16 * wrb;
    dst[done..].copy_from_slice(&src[done..]);
    Ok(dst)
}

/// One group: block b of row r (plain, at r · wrb + b · block of `s`) into the group's block
/// b (16 · block bytes at b · 16 · block of `d`).
///
/// # Safety
/// `s` and `d` hold 16 · blocks · block bytes each.
#[inline(always)]
unsafe fn pack_group<M: Moves>(s: *const u8, d: *mut u8, blocks: usize, block: usize) {
    assert_eq!(block, M::BLOCK);
    let (wrb, gb) = (blocks * M::BLOCK, X16 * M::BLOCK);
    for b in 0..blocks {
        // SAFETY: every piece lies inside a block on both sides (`pieces_tile_the_blocks`).
        unsafe {
            let out = d.add(b * gb);
            for r in 0..X16 {
                let blk = s.add(r * wrb + b * M::BLOCK);
                for &(at, to) in M::TWO {
                    let v = blk.add(at).cast::<u16>().read_unaligned();
                    out.add(to + 2 * r).cast::<u16>().write_unaligned(v);
                }
                for &(at, to) in M::FOUR {
                    let v = blk.add(at).cast::<u32>().read_unaligned();
                    out.add(to + 4 * r).cast::<u32>().write_unaligned(v);
                }
            }
        }
    }
}

/// The 16 plain rows (`16 · wrb` bytes into `out`) of one group's packed bytes: the inverse
/// of [`pack_x16`], for the tests that show nothing is lost (no kernel reads plain rows of a
/// packed weight).
#[cfg(test)]
pub fn unpack_x16(layout: Layout, group: &[u8], blocks: usize, out: &mut [u8]) {
    let block = layout.weight_type().map_or(0, |t| t.type_size() as usize);
    let (wrb, gb) = (blocks * block, X16 * block);
    assert!(
        block > 0 && group.len() == blocks * gb && out.len() == X16 * wrb,
        "a {layout:?} group of {blocks} super-blocks"
    );
    // SAFETY: the assertion (sizes) and `unpack_group`'s own check of the block size.
    unsafe {
        by_layout!(
            layout,
            (),
            unpack_group(group.as_ptr(), out.as_mut_ptr(), blocks, block)
        )
    }
}

#[cfg(test)]
/// # Safety
/// `g` holds 16 · blocks · block bytes of packed group, `o` 16 plain rows of `blocks` blocks.
#[inline(always)]
unsafe fn unpack_group<M: Moves>(g: *const u8, o: *mut u8, blocks: usize, block: usize) {
    assert_eq!(block, M::BLOCK);
    let (wrb, gb) = (blocks * M::BLOCK, X16 * M::BLOCK);
    for b in 0..blocks {
        // SAFETY: block b of the group is gb bytes at b · gb; row r's block b is `block`
        // bytes at r · wrb + b · block of `o`. Every piece lies inside both: to + len · 16 <=
        // gb and at + len <= block (`pieces_tile_the_blocks`).
        unsafe {
            let (g, o) = (g.add(b * gb), o.add(b * M::BLOCK));
            for &(at, to) in M::TWO {
                for r in 0..X16 {
                    let v = g.add(to + 2 * r).cast::<u16>().read_unaligned();
                    o.add(r * wrb + at).cast::<u16>().write_unaligned(v);
                }
            }
            for &(at, to) in M::FOUR {
                for r in 0..X16 {
                    let v = g.add(to + 4 * r).cast::<u32>().read_unaligned();
                    o.add(r * wrb + at).cast::<u32>().write_unaligned(v);
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
    fn packing_writes_the_table_layout_on_any_thread_count() {
        // 1,045 rows of 4,096: 65 groups of 36,864 bytes, 29 a task (about 1 MiB), so three
        // tasks, the last one short, and 5 plain rows past the groups.
        let (k, m) = (4096, 1045);
        let src = random_blocks(GgmlType::Q4_0, m * k / 32, 21);
        let one = pack_x16(Layout::Q40X16, &src, k, m).unwrap();
        // The layout written out move by move from the piece table, apart from the packer.
        let (block, pieces) = Layout::Q40X16.pieces();
        let (blocks, wrb) = (k / 32, k / 32 * block);
        let mut want = src.clone();
        for g in 0..m / X16 {
            for b in 0..blocks {
                for r in 0..X16 {
                    for &(at, to, len) in &pieces {
                        let from = (X16 * g + r) * wrb + b * block + at;
                        let into = X16 * g * wrb + b * X16 * block + to + len * r;
                        want[into..into + len].copy_from_slice(&src[from..from + len]);
                    }
                }
            }
        }
        assert!(one[..] == want[..], "one thread");
        for threads in [2, 3, 8] {
            let many = pack_x16_on(Layout::Q40X16, &src, k, m, threads, false).unwrap();
            assert!(one[..] == many[..], "{threads} threads");
        }
        assert!(one[..] != src[..], "the groups are interleaved");
        assert_eq!(
            one[65 * 16 * 2304..],
            src[65 * 16 * 2304..],
            "the 5 plain rows"
        );
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
            let mut plain = vec![0u8; block];
            let mut packed = vec![0u8; X16 * block];
            for &(at, to, len) in &pieces {
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
