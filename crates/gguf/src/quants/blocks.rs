//! The block layouts as `#[repr(C)]` structs, field for field as ggml declares them, for code
//! that wants names instead of byte offsets (kernels, model synthesis). f16 fields are raw
//! bits (`u16`; convert with [`super::f16_to_f32`]). Each struct's size is asserted at compile
//! time (no padding) and tested against [`GgmlType::type_size`].

use crate::GgmlType;

/// A block struct that mirrors a GGML type's bytes.
///
/// # Safety
/// Implementors are `#[repr(C)]`, have no padding (size == the type's block bytes, checked
/// below) and contain only integer fields, so every byte pattern is a valid value.
pub unsafe trait Block: Copy {
    const TYPE: GgmlType;

    /// Copies the block at the start of `bytes`; None when `bytes` is shorter than a block.
    /// (Extra bytes are ignored.)
    fn read(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < std::mem::size_of::<Self>() {
            return None;
        }
        // SAFETY: the length is checked above; `read_unaligned` has no alignment requirement;
        // the trait's contract makes every bit pattern a valid `Self`.
        Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) })
    }
}

#[cfg(not(target_endian = "little"))]
compile_error!("minfer reads GGML blocks in place and needs a little-endian host");

macro_rules! blocks {
    ($($(#[$doc:meta])* $name:ident = $ty:ident, $bytes:literal { $($field:ident : $fty:ty),* $(,)? })*) => {$(
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct $name { $(pub $field: $fty),* }

        // SAFETY: repr(C), integer fields only, and the size assertion rules out padding.
        unsafe impl Block for $name {
            const TYPE: GgmlType = GgmlType::$ty;
        }

        const _: () = assert!(std::mem::size_of::<$name>() == $bytes);
    )*};
}

blocks! {
    /// 32 elements: w = d * (q - 8).
    BlockQ4_0 = Q4_0, 18 { d: u16, qs: [u8; 16] }
    /// 32 elements: w = d * q + m.
    BlockQ4_1 = Q4_1, 20 { d: u16, m: u16, qs: [u8; 16] }
    /// 32 elements: w = d * (q - 16), q's fifth bit in `qh` (bit j = element j).
    BlockQ5_0 = Q5_0, 22 { d: u16, qh: [u8; 4], qs: [u8; 16] }
    /// 32 elements: w = d * q + m.
    BlockQ5_1 = Q5_1, 24 { d: u16, m: u16, qh: [u8; 4], qs: [u8; 16] }
    /// 32 elements: w = d * q.
    BlockQ8_0 = Q8_0, 34 { d: u16, qs: [i8; 32] }
    /// 32 elements: w = d * q; s = d * sum(q).
    BlockQ8_1 = Q8_1, 36 { d: u16, s: u16, qs: [i8; 32] }
    /// 256 elements, 16 sub-blocks of 16: w = d * (sc & 15) * q - dmin * (sc >> 4).
    BlockQ2K = Q2K, 84 { scales: [u8; 16], qs: [u8; 64], d: u16, dmin: u16 }
    /// 256 elements, 16 sub-blocks of 16: w = d * (scale - 32) * (q - 4 * !hbit).
    BlockQ3K = Q3K, 110 { hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: u16 }
    /// 256 elements, 8 sub-blocks of 32: w = d * sc * q - dmin * m.
    BlockQ4K = Q4K, 144 { d: u16, dmin: u16, scales: [u8; 12], qs: [u8; 128] }
    /// 256 elements, 8 sub-blocks of 32: w = d * sc * q - dmin * m, 5-bit q.
    BlockQ5K = Q5K, 176 { d: u16, dmin: u16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }
    /// 256 elements, 16 sub-blocks of 16: w = d * scale * (q - 32).
    BlockQ6K = Q6K, 210 { ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: u16 }
    /// 256 elements: w = d * q; `bsums[j]` = sum of `q[16j..16j + 16]`.
    BlockQ8K = Q8K, 292 { d: f32, qs: [i8; 256], bsums: [i16; 16] }
    /// 32 elements: w = d * `KVALUES_IQ4NL[q]`.
    BlockIq4Nl = Iq4Nl, 18 { d: u16, qs: [u8; 16] }
    /// 256 elements, 8 sub-blocks of 32: w = d * (scale - 32) * `KVALUES_IQ4NL[q]`.
    BlockIq4Xs = Iq4Xs, 136 { d: u16, scales_h: u16, scales_l: [u8; 4], qs: [u8; 128] }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quants::{f16_to_f32, random_blocks};

    #[test]
    fn struct_sizes_are_the_type_sizes() {
        fn check<B: Block>() {
            assert_eq!(
                std::mem::size_of::<B>() as u64,
                B::TYPE.type_size(),
                "{}",
                B::TYPE
            );
        }
        check::<BlockQ4_0>();
        check::<BlockQ4_1>();
        check::<BlockQ5_0>();
        check::<BlockQ5_1>();
        check::<BlockQ8_0>();
        check::<BlockQ8_1>();
        check::<BlockQ2K>();
        check::<BlockQ3K>();
        check::<BlockQ4K>();
        check::<BlockQ5K>();
        check::<BlockQ6K>();
        check::<BlockQ8K>();
        check::<BlockIq4Nl>();
        check::<BlockIq4Xs>();
    }

    #[test]
    fn structs_read_the_fields_the_byte_code_reads() {
        let b = random_blocks(GgmlType::Q4K, 1, 3);
        let blk = BlockQ4K::read(&b).unwrap();
        assert_eq!(blk.d, u16::from_le_bytes([b[0], b[1]]));
        assert_eq!(&blk.qs[..], &b[16..144]);
        let b = random_blocks(GgmlType::Q8K, 1, 3);
        let blk = BlockQ8K::read(&b).unwrap();
        assert_eq!(blk.d, f32::from_le_bytes(b[0..4].try_into().unwrap()));
        let s: i32 = blk.qs[16..32].iter().map(|&q| q as i32).sum();
        assert_eq!(blk.bsums[1] as i32, s);
        let b = random_blocks(GgmlType::Q6K, 1, 3);
        assert!(f16_to_f32(BlockQ6K::read(&b).unwrap().d).is_finite());
        assert_eq!(BlockQ6K::read(&b[..209]), None);
    }
}
