//! SIMD dot products and activation quantization, chosen once at run time by CPU features.
//!
//! Every kernel here is bit-identical to the scalar reference in [`minfer_gguf::quants`]:
//! integer block sums are exact, and the f32/f64 arithmetic that follows (per-block scaling,
//! accumulation over blocks, the lane tree of the float dots) performs the same IEEE operations
//! in the same order, never fused. `tests/simd_exact.rs` proves it type by type.
//!
//! - [`vec_dot`] / [`quantize_act`] use the best instruction set this machine has
//!   ([`detected`]); types without a kernel there use the scalar reference.
//! - [`vec_dot_on`] / [`quantize_act_on`] force one instruction set (tests, benchmarks); an
//!   instruction set this machine lacks is a typed error, never a silent fallback.
//!
//! Instruction sets: x86-64 AVX2 (+F16C), x86-64 AVX-512 F/BW/VL/VNNI (types without an
//! AVX-512 kernel run the AVX2 one there), aarch64 NEON and NEON + dot-product (`sdot`; float
//! rows and quantizers run NEON's there), both tested under qemu.

use std::fmt;
use std::sync::OnceLock;

use minfer_gguf::quants::{self, check_quantize_row, check_vec_dot};
use minfer_gguf::{Error, GgmlType, Result};

#[cfg(target_arch = "aarch64")]
mod arm;
mod tiles;
#[cfg(target_arch = "x86_64")]
mod x86;

pub mod attn;
pub use tiles::{
    finish as finish_tile, RowSideFn, TileAcc, TileFn, TileMut, TilePairFn, TileSide, TileSlice,
    IQ8K_BLOCK, IQ_BLOCK, TILE,
};

/// A dot kernel for whole rows whose lengths [`check_vec_dot`] has accepted:
/// `(weight row, activation row) -> dot`.
pub type DotFn = fn(&[u8], &[u8]) -> f32;
/// A bare kernel dotting one weight row with 4 activation rows (each result bit-identical to
/// the [`DotFn`] of the same type).
pub type Dot4Fn = fn(&[u8], [&[u8]; 4]) -> [f32; 4];
/// An activation quantizer for whole rows whose lengths [`check_quantize_row`] has accepted.
type QuantFn = fn(&[f32], &mut [u8]);
/// The decode kernel of rows packed 16 at a time (`ops::matmul::packed`): `(group bytes,
/// activation row, the 16 dots)`, each dot bit-identical to the reference's for that row.
/// Panics unless the group holds as many super-blocks as the row.
pub type X16Fn = fn(&[u8], &[u8], &mut [f32; 16]);
/// [`X16Fn`] for four activation rows at once (the group's bytes loaded and unpacked once):
/// each row's 16 dots the same bits as [`X16Fn`]'s for it alone.
pub type X16x4Fn = fn(&[u8], [&[u8]; 4], &mut [[f32; 16]; 4]);

/// Per-block facts of one Q8_0 activation row, as the matmul's side table holds them
/// ([`TileSide::row`] after [`TileSide::fill_rows`]): each block's d as f32 (the exact
/// conversion of its f16) and the sum of its 32 quants. What the packed kernels of the types
/// whose weights are biased to unsigned (Q4_0, Q5_0, Q8_0) would otherwise derive again for
/// every group of 16 rows.
#[derive(Clone, Copy, Debug)]
pub struct ActFacts<'a> {
    pub d: &'a [f32],
    pub sums: &'a [i32],
}

/// [`X16Fn`] reading the activation row's per-block d and Σ q from its [`ActFacts`] instead
/// of deriving them: the same bits as [`X16Fn`] whenever the facts are the row's (a fact of
/// another value gives another result; the kernels trust them). Panics unless the facts hold
/// one d and one sum per block.
pub type X16FactsFn = fn(&[u8], &[u8], ActFacts<'_>, &mut [f32; 16]);
/// [`X16FactsFn`] for four activation rows at once, each with its facts.
pub type X16Factsx4Fn = fn(&[u8], [&[u8]; 4], [ActFacts<'_>; 4], &mut [[f32; 16]; 4]);

/// A type's packed kernels that read the activations' facts: one activation row, and four.
#[derive(Clone, Copy, Debug)]
pub struct X16FactsFns {
    pub one: X16FactsFn,
    pub four: X16Factsx4Fn,
}

/// A type's packed kernels: one activation row, and four; and where the type's kernels need
/// per-block activation sums (Q4_0, Q5_0, Q8_0), their forms that read them from the side
/// table ([`X16FactsFns`]); and where the instruction set has one, the prompt form
/// ([`X16Wide`]).
#[derive(Clone, Copy, Debug)]
pub struct X16Fns {
    pub one: X16Fn,
    pub four: X16x4Fn,
    pub facts: Option<X16FactsFns>,
    pub wide: Option<X16Wide>,
}

/// Unpacks one packed group (`blocks · group block` bytes) into a kernel's expanded form
/// (`blocks · X16Wide::block_bytes`).
pub type X16ExpandFn = fn(&[u8], &mut [u8]);

/// The prompt form of a type's packed kernels, for calls with many tokens: a group is
/// unpacked once ([`X16Wide::expand`]: what the packed kernels redo for every four tokens,
/// e.g. Q5_0's fifth bits put on its nibbles) and [`X16Wide::four`] dots the expansion with
/// four activation rows at a time, each row's 16 dots the bits of the packed kernels' (and so
/// of the reference's). [`X16Wide::four`] reads each activation block's d and Σ q from the
/// rows' [`ActFacts`] where [`X16Wide::facts`] says so (Q5_0, which takes its weights' bias
/// back by them), else ignores them.
#[derive(Clone, Copy, Debug)]
pub struct X16Wide {
    /// Bytes of the expansion per block of the weight type (32 elements for the legacy
    /// types, 256 for the K-quants) of a group of 16 rows.
    pub block_bytes: usize,
    /// Whether [`X16Wide::four`] reads the activations' facts.
    pub facts: bool,
    /// Tokens from which a matmul takes this form: expanding a group once costs about what
    /// [`X16Wide::four`] saves over the packed kernel on this many tokens
    /// (`benches/x16_kernels.rs`).
    pub from: usize,
    pub expand: X16ExpandFn,
    /// `(expanded group, four activation rows, their facts, the 16 dots of each)`: panics
    /// unless the expansion holds as many blocks as each row and its facts.
    pub four: X16Factsx4Fn,
}

/// The packed kernels of `ty` for the instruction set in use ([`detected`]); None where there
/// are none (the weights then stay in plain rows: the backend packs a weight exactly when
/// this answers Some, and a matmul refuses a packed weight when it answers None).
pub fn x16_kernel(ty: GgmlType) -> Option<X16Fns> {
    x16_kernel_on(detected(), ty)
}

/// The packed kernels of `ty` on one instruction set (None where it has none, or where this
/// machine lacks it): AVX-512 VNNI's and AVX2's read the same layouts and give the same bits.
/// Each set has its own; none stands in for another's.
pub fn x16_kernel_on(isa: Isa, ty: GgmlType) -> Option<X16Fns> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => x86::avx512_packed(ty),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::avx2_packed(ty),
        _ => {
            let _ = ty;
            None
        }
    }
}

/// An instruction set the kernels are written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// The scalar reference of `minfer_gguf::quants` (every machine).
    Scalar,
    /// x86-64 AVX2 with F16C (no FMA: fused multiply-adds would round differently).
    Avx2,
    /// x86-64 AVX-512 F + BW + VL + VNNI (with AVX2 and F16C): the AVX2 kernels serve the
    /// types it has no kernel for. Cores without VNNI (Skylake-SP/X) run [`Isa::Avx2`].
    Avx512Vnni,
    /// aarch64 NEON (baseline).
    Neon,
    /// aarch64 NEON with the dot-product extension (`sdot`, emitted with inline asm): the NEON
    /// kernels with 16 byte products per instruction; float rows and quantizers run NEON's.
    NeonDotprod,
}

impl Isa {
    /// Every instruction set minfer has kernels for, best last.
    pub const ALL: [Isa; 5] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::Avx512Vnni,
        Isa::Neon,
        Isa::NeonDotprod,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Neon => "neon",
            Isa::NeonDotprod => "neon-dotprod",
        }
    }

    /// Whether this machine can run the kernels (detected at run time by
    /// [`crate::cpu_features`], not guessed).
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::avx2_supported(),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 => false,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => x86::avx512_supported(),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512Vnni => false,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => arm::neon_supported(),
            #[cfg(not(target_arch = "aarch64"))]
            Isa::Neon => false,
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDotprod => arm::dotprod_supported(),
            #[cfg(not(target_arch = "aarch64"))]
            Isa::NeonDotprod => false,
        }
    }

    /// The dot kernel this instruction set has for weights of `ty`, if any.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(unused_variables)
    )]
    fn dot_kernel(self, ty: GgmlType) -> Option<DotFn> {
        match self {
            Isa::Scalar => None,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::avx2_dot(ty),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 => None,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => x86::avx512_dot(ty),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512Vnni => None,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => arm::neon_dot(ty),
            #[cfg(not(target_arch = "aarch64"))]
            Isa::Neon => None,
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDotprod => arm::dotprod_dot(ty),
            #[cfg(not(target_arch = "aarch64"))]
            Isa::NeonDotprod => None,
        }
    }

    /// The activation quantizer this instruction set has for `ty`, if any.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(unused_variables)
    )]
    fn quant_kernel(self, ty: GgmlType) -> Option<QuantFn> {
        match self {
            Isa::Scalar => None,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::avx2_quant(ty),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 => None,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => x86::avx512_quant(ty),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512Vnni => None,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => arm::neon_quant(ty),
            #[cfg(not(target_arch = "aarch64"))]
            Isa::Neon => None,
            Isa::NeonDotprod => None,
        }
    }

    /// The instruction set whose kernels also run here, consulted for types this one has
    /// no kernel for.
    fn subset(self) -> Option<Isa> {
        match self {
            Isa::Avx512Vnni => Some(Isa::Avx2),
            Isa::NeonDotprod => Some(Isa::Neon),
            _ => None,
        }
    }

    /// The instruction set that actually computes `vec_dot_on(self, ty, ..)`: `self` when it
    /// has a kernel for `ty`, else its subset's (AVX-512 -> AVX2, NEON-dotprod -> NEON), else [`Isa::Scalar`].
    pub fn dot_served_by(self, ty: GgmlType) -> Isa {
        if self.dot_kernel(ty).is_some() {
            self
        } else {
            self.subset()
                .map_or(Isa::Scalar, |sub| sub.dot_served_by(ty))
        }
    }

    /// The instruction set that actually computes `quantize_act_on(self, ty, ..)`.
    pub fn quant_served_by(self, ty: GgmlType) -> Isa {
        if self.quant_kernel(ty).is_some() {
            self
        } else {
            self.subset()
                .map_or(Isa::Scalar, |sub| sub.quant_served_by(ty))
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The instruction set the kernels run, decided once per process (the kernels are free
/// functions, so the cap is not per backend): the best this machine has, or the one
/// `MINFER_CPU_ISA` names ([`crate::settings::isa_from_env`]; results are bit-identical on
/// every set, only speed differs). An invalid `MINFER_CPU_ISA` panics here with that
/// function's message; the CLI checks it before any kernel runs, so there it is an error.
pub fn detected() -> Isa {
    static BEST: OnceLock<Isa> = OnceLock::new();
    *BEST.get_or_init(|| match crate::settings::isa_from_env() {
        Ok(Some(isa)) => isa,
        Ok(None) => Isa::ALL
            .into_iter()
            .rev()
            .find(|isa| isa.is_available())
            .unwrap_or(Isa::Scalar),
        Err(e) => panic!("{e}"),
    })
}

/// The instruction sets this machine can run (always includes [`Isa::Scalar`]).
pub fn available() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
}

/// Dot product of one weight row (`n` elements of `ty`) with one activation row encoded in
/// `quants::vec_dot_type(ty)`; bit-identical to [`quants::vec_dot`], with the same errors.
/// In a loop over rows, resolve the kernel once with [`RowDot::new`] instead.
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> Result<f32> {
    RowDot::on(detected(), ty)?.dot(n, w, act)
}

/// [`vec_dot`] on one instruction set; an instruction set this machine lacks is an error.
pub fn vec_dot_on(isa: Isa, ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> Result<f32> {
    RowDot::on(isa, ty)?.dot(n, w, act)
}

/// The dot kernel for one weight type, resolved once (instruction set, kernel, block
/// geometry) so that a matmul's inner loop only checks lengths and calls it.
#[derive(Clone, Copy)]
pub struct RowDot {
    ty: GgmlType,
    isa: Isa,
    kernel: Option<DotFn>,
    /// (elements, bytes) per block of the weights and of the activations.
    w_block: (usize, usize),
    a_block: (usize, usize),
}

impl RowDot {
    /// The best kernel of this machine for weights of `ty`.
    pub fn new(ty: GgmlType) -> Result<RowDot> {
        RowDot::on(detected(), ty)
    }

    /// The kernel of `isa` for weights of `ty` (the scalar reference where `isa` has none).
    pub fn on(isa: Isa, ty: GgmlType) -> Result<RowDot> {
        require(isa)?;
        let geometry = |t: GgmlType| {
            let (bs, ts) = t.block_geometry();
            (bs as usize, ts as usize)
        };
        // Refuses unsupported types with the reference's error.
        let w_block = geometry(ty);
        check_vec_dot(
            ty,
            w_block.0,
            w_block.1,
            geometry(quants::vec_dot_type(ty)).1,
        )?;
        let served = isa.dot_served_by(ty);
        Ok(RowDot {
            ty,
            isa: served,
            kernel: served.dot_kernel(ty),
            w_block,
            a_block: geometry(quants::vec_dot_type(ty)),
        })
    }

    /// The instruction set that computes this dot.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The weight type.
    pub fn weight_type(&self) -> GgmlType {
        self.ty
    }

    /// The bare kernel for rows of `n` elements of `w_len` weight and `act_len` activation
    /// bytes, when they fit it: a matmul checks its geometry once here instead of per call
    /// (the length checks' divisions cost as much as a short row's dot). `None` when this
    /// type has no kernel here or the rows do not fit; use [`RowDot::dot`] then.
    pub fn kernel_for(&self, n: usize, w_len: usize, act_len: usize) -> Option<DotFn> {
        let ((wbs, wts), (abs, ats)) = (self.w_block, self.a_block);
        let fits = n.is_multiple_of(wbs)
            && n.is_multiple_of(abs)
            && w_len == n / wbs * wts
            && act_len == n / abs * ats;
        self.kernel.filter(|_| fits)
    }

    /// [`RowDot::kernel_for`] for 4 activation rows at once (weight blocks unpacked once):
    /// only some types on some instruction sets have one.
    pub fn kernel4_for(&self, n: usize, w_len: usize, act_len: usize) -> Option<Dot4Fn> {
        self.kernel_for(n, w_len, act_len)?;
        #[cfg(target_arch = "x86_64")]
        match self.isa {
            Isa::Avx2 => return x86::avx2_dot4(self.ty),
            Isa::Avx512Vnni => return x86::avx512_dot4(self.ty),
            _ => {}
        }
        None
    }

    /// The dot of `n` elements; rows of the wrong size get the reference's errors.
    #[inline]
    pub fn dot(&self, n: usize, w: &[u8], act: &[u8]) -> Result<f32> {
        let ((wbs, wts), (abs, ats)) = (self.w_block, self.a_block);
        let fits = n.is_multiple_of(wbs)
            && n.is_multiple_of(abs)
            && w.len() == n / wbs * wts
            && act.len() == n / abs * ats;
        match self.kernel {
            Some(f) if fits => Ok(f(w, act)),
            Some(_) => {
                check_vec_dot(self.ty, n, w.len(), act.len())?;
                // Unreachable: check_vec_dot tests what `fits` tests and has failed above.
                Err(Error::Invalid(format!(
                    "vec_dot: {} row of {n} elements with {} weight and {} activation bytes",
                    self.ty,
                    w.len(),
                    act.len()
                )))
            }
            None => quants::vec_dot(self.ty, n, w, act),
        }
    }
}

/// Quantizes one activation row into `ty` (normally Q8_0, Q8_1 or Q8_K; every target of
/// [`quants::quantize_row`] is accepted); byte-identical to [`quants::quantize_act_row`]
/// (llama.cpp's x86 activation rule).
pub fn quantize_act(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    quantize_act_on(detected(), ty, src, dst)
}

/// [`quantize_act`] on one instruction set; an instruction set this machine lacks is an error.
pub fn quantize_act_on(isa: Isa, ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    check_quantize_row(ty, src.len(), dst.len())?;
    require(isa)?;
    match isa.quant_served_by(ty).quant_kernel(ty) {
        Some(f) => {
            f(src, dst);
            Ok(())
        }
        None => quants::quantize_act_row(ty, src, dst),
    }
}

/// The reference's accumulation of quantized block values (`quants::vec_dot`): block b adds
/// into lane b % 4, and the lanes combine as (lane 0 + lane 2) + (lane 1 + lane 3).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
struct BlockSum {
    lanes: [f32; quants::BLOCK_LANES],
    next: usize,
}

#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
impl BlockSum {
    fn new() -> BlockSum {
        BlockSum {
            lanes: [0.0; quants::BLOCK_LANES],
            next: 0,
        }
    }

    /// Adds the value of the next block.
    #[inline]
    fn add(&mut self, v: f32) {
        self.lanes[self.next % quants::BLOCK_LANES] += v;
        self.next += 1;
    }

    fn total(&self) -> f32 {
        let l = &self.lanes;
        (l[0] + l[2]) + (l[1] + l[3])
    }
}

fn require(isa: Isa) -> Result<()> {
    if isa.is_available() {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{isa} kernels requested, but this CPU lacks the {isa} instruction set"
        )))
    }
}
