//! The CPU features the kernels need, detected once per process (CPUID on x86-64, the
//! kernel's hwcaps on aarch64). Every kernel table of the crate asks here before handing out
//! a `#[target_feature]` kernel, so the soundness of those calls rests on this one module.
//!
//! Each function names exactly the feature set one family of kernels is compiled for:
//! - [`avx2_f16c`]: minfer's native x86 kernels (`simd::x86`); FMA deliberately unused there.
//! - [`avx2_fma_f16c`]: llama.cpp's x86 arithmetic (`llamacpp_x86`) and the attention row kernels,
//!   whose float order has fused multiply-adds.
//! - [`avx512_vnni`]: the native AVX-512 kernels (which also call AVX2 + F16C helpers).
//! - [`neon`], [`neon_dotprod`]: the aarch64 kernels (`simd::arm`).
//!
//! On other architectures every function returns `false`.

use std::sync::OnceLock;

/// The answers of one detection.
#[derive(Clone, Copy, Debug, Default)]
struct Features {
    avx2_f16c: bool,
    avx2_fma_f16c: bool,
    avx512_vnni: bool,
    avx512_bitalg: bool,
    neon: bool,
    neon_dotprod: bool,
}

fn features() -> &'static Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    FEATURES.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Features {
    let avx2_f16c = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c");
    let avx512_vnni = avx2_f16c
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    Features {
        avx2_f16c,
        avx2_fma_f16c: avx2_f16c && is_x86_feature_detected!("fma"),
        avx512_vnni,
        avx512_bitalg: avx512_vnni && is_x86_feature_detected!("avx512bitalg"),
        ..Features::default()
    }
}

#[cfg(target_arch = "aarch64")]
fn detect() -> Features {
    let neon = std::arch::is_aarch64_feature_detected!("neon");
    Features {
        neon,
        neon_dotprod: neon && std::arch::is_aarch64_feature_detected!("dotprod"),
        ..Features::default()
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> Features {
    Features::default()
}

/// x86-64 AVX2 and F16C.
pub fn avx2_f16c() -> bool {
    features().avx2_f16c
}

/// x86-64 AVX2, FMA and F16C.
pub fn avx2_fma_f16c() -> bool {
    features().avx2_fma_f16c
}

/// x86-64 AVX-512 F, BW, VL and VNNI, with AVX2 and F16C. Cores with AVX-512 but no VNNI
/// (Skylake-SP/X) answer `false`.
pub fn avx512_vnni() -> bool {
    features().avx512_vnni
}

/// [`avx512_vnni`] and AVX-512 BITALG (`vpshufbitqmb`: Ice Lake, Zen 4 and later).
pub fn avx512_bitalg() -> bool {
    features().avx512_bitalg
}

/// aarch64 NEON.
pub fn neon() -> bool {
    features().neon
}

/// aarch64 NEON with the dot-product extension (`sdot`).
pub fn neon_dotprod() -> bool {
    features().neon_dotprod
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each set includes the ones it is built on (kernels of a wider set call the narrower
    /// one's helpers).
    #[test]
    fn feature_sets_nest() {
        assert!(!avx2_fma_f16c() || avx2_f16c());
        assert!(!avx512_vnni() || avx2_f16c());
        assert!(!avx512_bitalg() || avx512_vnni());
        assert!(!neon_dotprod() || neon());
        assert!(!(avx2_f16c() && neon()));
    }
}
