//! GGML tensor element types: ids as they appear in GGUF files, block geometry, and which
//! ones minfer can compute with.
//!
//! Every id ggml has ever assigned is known by name, so an unsupported file is refused with
//! the type's real name instead of "unknown type 16".

use std::fmt;

/// A GGML element type id, as stored in a GGUF tensor info (`u32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq2Xxs,
    Iq2Xs,
    Iq3Xxs,
    Iq1S,
    Iq4Nl,
    Iq3S,
    Iq2S,
    Iq4Xs,
    I8,
    I16,
    I32,
    I64,
    F64,
    Iq1M,
    Bf16,
    Tq1_0,
    Tq2_0,
    Mxfp4,
    Nvfp4,
    Q1_0,
}

/// Ids ggml assigned once and later removed (the interleaved CPU repack formats and the
/// early Q4_2/Q4_3). Files carrying them are refused by name too.
fn removed_name(id: u32) -> Option<&'static str> {
    Some(match id {
        4 => "Q4_2 (removed from ggml)",
        5 => "Q4_3 (removed from ggml)",
        31 => "Q4_0_4_4 (removed from ggml)",
        32 => "Q4_0_4_8 (removed from ggml)",
        33 => "Q4_0_8_8 (removed from ggml)",
        36 => "IQ4_NL_4_4 (removed from ggml)",
        37 => "IQ4_NL_4_8 (removed from ggml)",
        38 => "IQ4_NL_8_8 (removed from ggml)",
        _ => return None,
    })
}

/// What a type id means to minfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypeId {
    /// A type ggml defines today.
    Known(GgmlType),
    /// A type ggml once defined and removed; the string is its name.
    Removed(u32, &'static str),
    /// An id no ggml version has used.
    Unknown(u32),
}

impl TypeId {
    pub fn from_u32(id: u32) -> TypeId {
        if let Some(t) = GgmlType::from_id(id) {
            TypeId::Known(t)
        } else if let Some(n) = removed_name(id) {
            TypeId::Removed(id, n)
        } else {
            TypeId::Unknown(id)
        }
    }
}

impl GgmlType {
    /// All types ggml defines, in id order.
    pub const ALL: [GgmlType; 34] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
        GgmlType::Iq2Xxs,
        GgmlType::Iq2Xs,
        GgmlType::Iq3Xxs,
        GgmlType::Iq1S,
        GgmlType::Iq4Nl,
        GgmlType::Iq3S,
        GgmlType::Iq2S,
        GgmlType::Iq4Xs,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::Iq1M,
        GgmlType::Bf16,
        GgmlType::Tq1_0,
        GgmlType::Tq2_0,
        GgmlType::Mxfp4,
        GgmlType::Nvfp4,
        GgmlType::Q1_0,
    ];

    /// The weight types minfer reads, dequantizes and computes with.
    pub const SUPPORTED: [GgmlType; 17] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Bf16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
        GgmlType::Iq4Nl,
        GgmlType::Iq4Xs,
    ];

    pub fn from_id(id: u32) -> Option<GgmlType> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2K,
            11 => Q3K,
            12 => Q4K,
            13 => Q5K,
            14 => Q6K,
            15 => Q8K,
            16 => Iq2Xxs,
            17 => Iq2Xs,
            18 => Iq3Xxs,
            19 => Iq1S,
            20 => Iq4Nl,
            21 => Iq3S,
            22 => Iq2S,
            23 => Iq4Xs,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => Iq1M,
            30 => Bf16,
            34 => Tq1_0,
            35 => Tq2_0,
            39 => Mxfp4,
            40 => Nvfp4,
            41 => Q1_0,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2K => 10,
            Q3K => 11,
            Q4K => 12,
            Q5K => 13,
            Q6K => 14,
            Q8K => 15,
            Iq2Xxs => 16,
            Iq2Xs => 17,
            Iq3Xxs => 18,
            Iq1S => 19,
            Iq4Nl => 20,
            Iq3S => 21,
            Iq2S => 22,
            Iq4Xs => 23,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            Iq1M => 29,
            Bf16 => 30,
            Tq1_0 => 34,
            Tq2_0 => 35,
            Mxfp4 => 39,
            Nvfp4 => 40,
            Q1_0 => 41,
        }
    }

    /// The name llama.cpp prints for the type.
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2K => "Q2_K",
            Q3K => "Q3_K",
            Q4K => "Q4_K",
            Q5K => "Q5_K",
            Q6K => "Q6_K",
            Q8K => "Q8_K",
            Iq2Xxs => "IQ2_XXS",
            Iq2Xs => "IQ2_XS",
            Iq3Xxs => "IQ3_XXS",
            Iq1S => "IQ1_S",
            Iq4Nl => "IQ4_NL",
            Iq3S => "IQ3_S",
            Iq2S => "IQ2_S",
            Iq4Xs => "IQ4_XS",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            Iq1M => "IQ1_M",
            Bf16 => "BF16",
            Tq1_0 => "TQ1_0",
            Tq2_0 => "TQ2_0",
            Mxfp4 => "MXFP4",
            Nvfp4 => "NVFP4",
            Q1_0 => "Q1_0",
        }
    }

    /// Parses a name as `name()` prints it (case-insensitive).
    pub fn from_name(s: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
    }

    pub fn is_supported(self) -> bool {
        GgmlType::SUPPORTED.contains(&self)
    }

    /// (elements per block, bytes per block). Geometry is known for every type so that
    /// a file's offsets can be validated even when its type is one we refuse to compute.
    pub fn block_geometry(self) -> (u64, u64) {
        use GgmlType::*;
        match self {
            F32 => (1, 4),
            F16 | Bf16 => (1, 2),
            I8 => (1, 1),
            I16 => (1, 2),
            I32 => (1, 4),
            I64 | F64 => (1, 8),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            Q2K => (256, 84),
            Q3K => (256, 110),
            Q4K => (256, 144),
            Q5K => (256, 176),
            Q6K => (256, 210),
            Q8K => (256, 292),
            Iq2Xxs => (256, 66),
            Iq2Xs => (256, 74),
            Iq3Xxs => (256, 98),
            Iq1S => (256, 50),
            Iq4Nl => (32, 18),
            Iq3S => (256, 110),
            Iq2S => (256, 82),
            Iq4Xs => (256, 136),
            Iq1M => (256, 56),
            Tq1_0 => (256, 54),
            Tq2_0 => (256, 66),
            Mxfp4 => (32, 17),
            Nvfp4 => (64, 36),
            Q1_0 => (128, 18),
        }
    }

    pub fn block_size(self) -> u64 {
        self.block_geometry().0
    }

    pub fn type_size(self) -> u64 {
        self.block_geometry().1
    }

    /// Bytes of a row of `n` elements, or None when `n` is not a whole number of blocks
    /// or the product overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let (bs, ts) = self.block_geometry();
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(ts)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for TypeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TypeId::Known(t) => write!(f, "{t}"),
            TypeId::Removed(_, n) => f.write_str(n),
            TypeId::Unknown(id) => write!(f, "unknown type id {id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_for_every_type() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
    }

    #[test]
    fn removed_and_unknown_ids_are_named() {
        assert_eq!(
            TypeId::from_u32(31).to_string(),
            "Q4_0_4_4 (removed from ggml)"
        );
        assert_eq!(TypeId::from_u32(999).to_string(), "unknown type id 999");
        assert_eq!(TypeId::from_u32(16).to_string(), "IQ2_XXS");
    }
}
