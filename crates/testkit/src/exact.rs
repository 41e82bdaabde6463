//! Bit-for-bit comparisons of f32 outputs, for the gates that hold a kernel or a path to
//! another's exact bits: a failure names the first place they differ.

/// The f32 bit patterns (for bit-for-bit comparisons).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The first index at which `got` and `want` differ bit for bit (None: the shorter is a
/// prefix of the longer).
pub fn first_difference(got: &[f32], want: &[f32]) -> Option<usize> {
    got.iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
}

/// Panics unless `got` is `want` bit for bit (lengths too), with `what` and the first
/// difference in the message.
#[track_caller]
pub fn assert_bits_eq(got: &[f32], want: &[f32], what: impl std::fmt::Display) {
    assert!(
        bits(got) == bits(want),
        "{what}: first difference at {:?}",
        first_difference(got, want)
    );
}
