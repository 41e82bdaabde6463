//! The file types (`general.file_type`, llama.cpp's `llama_ftype`) minfer can write, by the
//! names `llama-quantize` accepts.

use minfer_gguf::GgmlType;

/// A quantization mixture: the default weight type plus the per-tensor rules of
/// [`crate::recipe`]. The discriminant is the `general.file_type` value llama.cpp writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ftype {
    AllF32 = 0,
    MostlyF16 = 1,
    MostlyQ4_0 = 2,
    MostlyQ4_1 = 3,
    MostlyQ8_0 = 7,
    MostlyQ5_0 = 8,
    MostlyQ5_1 = 9,
    MostlyQ2K = 10,
    MostlyQ3KS = 11,
    MostlyQ3KM = 12,
    MostlyQ3KL = 13,
    MostlyQ4KS = 14,
    MostlyQ4KM = 15,
    MostlyQ5KS = 16,
    MostlyQ5KM = 17,
    MostlyQ6K = 18,
    MostlyIq4Nl = 25,
    MostlyIq4Xs = 30,
    MostlyBf16 = 32,
}

/// Names as `llama-quantize` takes them (case-insensitive), aliases included.
const NAMES: &[(&str, Ftype)] = &[
    ("F32", Ftype::AllF32),
    ("F16", Ftype::MostlyF16),
    ("BF16", Ftype::MostlyBf16),
    ("Q4_0", Ftype::MostlyQ4_0),
    ("Q4_1", Ftype::MostlyQ4_1),
    ("Q5_0", Ftype::MostlyQ5_0),
    ("Q5_1", Ftype::MostlyQ5_1),
    ("Q8_0", Ftype::MostlyQ8_0),
    ("Q2_K", Ftype::MostlyQ2K),
    ("Q3_K_S", Ftype::MostlyQ3KS),
    ("Q3_K_M", Ftype::MostlyQ3KM),
    ("Q3_K", Ftype::MostlyQ3KM),
    ("Q3_K_L", Ftype::MostlyQ3KL),
    ("Q4_K_S", Ftype::MostlyQ4KS),
    ("Q4_K_M", Ftype::MostlyQ4KM),
    ("Q4_K", Ftype::MostlyQ4KM),
    ("Q5_K_S", Ftype::MostlyQ5KS),
    ("Q5_K_M", Ftype::MostlyQ5KM),
    ("Q5_K", Ftype::MostlyQ5KM),
    ("Q6_K", Ftype::MostlyQ6K),
    ("IQ4_NL", Ftype::MostlyIq4Nl),
    ("IQ4_XS", Ftype::MostlyIq4Xs),
];

impl Ftype {
    /// Parses a `llama-quantize` type name (`Q4_K_M`, `q8_0`, the alias `Q4_K`, ...).
    pub fn from_name(s: &str) -> Option<Ftype> {
        NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(s))
            .map(|&(_, f)| f)
    }

    /// Every accepted name, for help and error text.
    pub fn names() -> impl Iterator<Item = &'static str> {
        NAMES.iter().map(|(n, _)| *n)
    }

    /// The canonical name (`Q4_K_M` for `Q4_K`).
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(n, f)| *f == self && !matches!(*n, "Q3_K" | "Q4_K" | "Q5_K"))
            .map(|(n, _)| *n)
            .expect("every Ftype has a name in NAMES")
    }

    /// The `general.file_type` value.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The weight type most tensors get (`llama_ftype_get_default_type`).
    pub fn default_type(self) -> GgmlType {
        use Ftype::*;
        match self {
            AllF32 => GgmlType::F32,
            MostlyF16 => GgmlType::F16,
            MostlyBf16 => GgmlType::Bf16,
            MostlyQ4_0 => GgmlType::Q4_0,
            MostlyQ4_1 => GgmlType::Q4_1,
            MostlyQ5_0 => GgmlType::Q5_0,
            MostlyQ5_1 => GgmlType::Q5_1,
            MostlyQ8_0 => GgmlType::Q8_0,
            MostlyQ2K => GgmlType::Q2K,
            MostlyQ3KS | MostlyQ3KM | MostlyQ3KL => GgmlType::Q3K,
            MostlyQ4KS | MostlyQ4KM => GgmlType::Q4K,
            MostlyQ5KS | MostlyQ5KM => GgmlType::Q5K,
            MostlyQ6K => GgmlType::Q6K,
            MostlyIq4Nl => GgmlType::Iq4Nl,
            MostlyIq4Xs => GgmlType::Iq4Xs,
        }
    }
}

/// Whether ggml counts the type as quantized (block-wise; F32/F16/BF16 are not).
pub fn is_quantized(ty: GgmlType) -> bool {
    ty.block_size() > 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_case_insensitively_and_aliases_resolve() {
        assert_eq!(Ftype::from_name("q4_k_m"), Some(Ftype::MostlyQ4KM));
        assert_eq!(Ftype::from_name("Q4_K"), Some(Ftype::MostlyQ4KM));
        assert_eq!(Ftype::MostlyQ4KM.name(), "Q4_K_M");
        assert_eq!(Ftype::MostlyQ4KM.id(), 15);
        assert_eq!(Ftype::from_name("IQ2_XXS"), None);
        for n in Ftype::names() {
            let f = Ftype::from_name(n).unwrap();
            assert_eq!(Ftype::from_name(f.name()), Some(f));
        }
    }
}
