//! What every kernel of rows packed 16 at a time shares, whatever its instruction set
//! (`avx2_*_x16.rs`, `avx512_*_x16.rs`): the activation block sizes, and checking a group
//! against its activation rows and walking their blocks in step. Plain Rust without
//! intrinsics or `#[target_feature]`, so that one copy serves kernels of either set of
//! target features, inlined into each (`#[inline(always)]`).
//!
//! Every kernel computes the 16 dots of a group `g` with each of its `N` activation rows `a`
//! (the group's bytes loaded and unpacked once for all of them; each row's values are the
//! one-row kernel's bits: its integers are exact and its float steps the same).
//!
//! The kernels whose weights are biased to unsigned (Q4_0, Q5_0, Q8_0) take the bias back as
//! a multiple of each activation block's Σ q, and scale by its d. Their `_facts` forms read
//! both from the matmul's side table ([`ActFacts`], filled once per matmul for every
//! activation row) where the plain forms derive them again for every group of 16 rows: the
//! same integer and the same f32 (the f16's exact conversion), so the same bits.

use crate::simd::ActFacts;

/// No facts: what the plain forms of the kernels pass their shared body, which then never
/// reads them.
pub(super) const NO_FACTS: ActFacts<'static> = ActFacts { d: &[], sums: &[] };

/// An activation block type of the kernels: its size, and its name for [`Blocks::new`]'s
/// panic.
#[derive(Clone, Copy)]
pub(super) struct Act {
    bytes: usize,
    name: &'static str,
}

/// Q8_0: d f16, qs i8[32].
pub(super) const Q8_0: Act = Act {
    bytes: 34,
    name: "Q8_0",
};
/// Q8_1: d f16, s f16, qs i8[32].
pub(super) const Q8_1: Act = Act {
    bytes: 36,
    name: "Q8_1",
};
/// Q8_K: d f32, qs i8[256], bsums i16[16].
pub(super) const Q8K: Act = Act {
    bytes: 292,
    name: "Q8_K",
};

/// Each activation row's 16 dots, the kernels' output.
pub(super) type Dots<const N: usize> = [[f32; 16]; N];

/// A packed group and its `N` activation rows, checked to hold the same number of blocks,
/// as an iterator over their blocks in step: block b of the group is `group_block` bytes at
/// b · `group_block` of it, and of each activation row `act.bytes` at b · `act.bytes`; the
/// iterator gives b and where block b starts in the group and in each row (pointers, so
/// that a kernel reads them at its own offsets, inside those blocks).
pub(super) struct Blocks<'a, const N: usize> {
    g: &'a [u8],
    a: [&'a [u8]; N],
    group_block: usize,
    act_block: usize,
    count: usize,
    next: usize,
}

impl<'a, const N: usize> Blocks<'a, N> {
    /// The blocks of `g` (a group of `ty` rows) and `a`; panics unless `g` is whole blocks
    /// of `group_block` bytes and every row of `a` as many blocks of `act`.
    #[inline(always)]
    #[track_caller]
    pub(super) fn new(
        g: &'a [u8],
        a: [&'a [u8]; N],
        group_block: usize,
        act: Act,
        ty: &'static str,
    ) -> Self {
        let count = g.len() / group_block;
        let mut fits = g.len() == count * group_block;
        for row in a {
            fits &= row.len() == count * act.bytes;
        }
        if !fits {
            mismatch(ty, act.name);
        }
        Self {
            g,
            a,
            group_block,
            act_block: act.bytes,
            count,
            next: 0,
        }
    }
}

impl<const N: usize> Blocks<'_, N> {
    /// Checks that each of `facts` (one per activation row) holds one d and one sum per
    /// block, as [`fact`] relies on; panics otherwise (a programming error: the matmul
    /// hands the side table's rows of the same activations).
    #[inline(always)]
    #[track_caller]
    pub(super) fn check_facts(&self, facts: &[ActFacts<'_>; N]) {
        let mut fits = true;
        for f in facts {
            fits &= f.d.len() == self.count && f.sums.len() == self.count;
        }
        if !fits {
            facts_mismatch();
        }
    }
}

/// Block `b`'s (d, Σ q) of `f`.
///
/// # Safety
/// `b` must be below the length of `f.d` and of `f.sums`: a block of the [`Blocks`] whose
/// [`Blocks::check_facts`] accepted `f`.
#[inline(always)]
pub(super) unsafe fn fact(f: &ActFacts<'_>, b: usize) -> (f32, i32) {
    // SAFETY: the caller's.
    unsafe { (*f.d.get_unchecked(b), *f.sums.get_unchecked(b)) }
}

impl<const N: usize> Iterator for Blocks<'_, N> {
    type Item = (usize, *const u8, [*const u8; N]);

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        let b = self.next;
        if b == self.count {
            return None;
        }
        self.next = b + 1;
        // SAFETY: b < count, and `new` checked that the group and every row hold count
        // blocks of their sizes, so each offset is inside its slice.
        let p = unsafe { self.g.as_ptr().add(b * self.group_block) };
        let mut ap = [p; N];
        for (ap, row) in ap.iter_mut().zip(self.a) {
            // SAFETY: as above.
            *ap = unsafe { row.as_ptr().add(b * self.act_block) };
        }
        Some((b, p, ap))
    }
}

/// The panic of [`Blocks::new`], out of line: so that a kernel sets up its message only on
/// this path, as it did with its own `assert!`, and not on every call.
#[cold]
#[inline(never)]
#[track_caller]
fn mismatch(ty: &'static str, act: &'static str) -> ! {
    panic!("a packed {ty} group against {act} rows")
}

/// The panic of [`Blocks::check_facts`], out of line as [`mismatch`].
#[cold]
#[inline(never)]
#[track_caller]
fn facts_mismatch() -> ! {
    panic!("activation facts that do not hold one d and one sum per block")
}
