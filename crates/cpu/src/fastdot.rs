//! Portable fast dot products for the weight types of the demo models. Same arithmetic as the
//! scalar references in `minfer_gguf::quants` (exact integer sums per block, then the f32
//! scales in the same order, block values added in the reference's lanes), so results are
//! bit-identical; the
//! difference is loop shape: straight i8/u8 lanes over contiguous bytes, which the compiler
//! vectorises, instead of unpacking each block into an element array first.

use minfer_gguf::quants::f16_to_f32;

/// The reference's block accumulation: block b adds into lane b % BLOCK_LANES, lanes
/// combine as (0 + 2) + (1 + 3).
#[derive(Default)]
struct Lanes {
    lanes: [f32; 4],
    next: usize,
}

const _: () = assert!(minfer_gguf::quants::BLOCK_LANES == 4);

impl Lanes {
    #[inline]
    fn add(&mut self, v: f32) {
        self.lanes[self.next % 4] += v;
        self.next += 1;
    }
    #[inline]
    fn total(&self) -> f32 {
        (self.lanes[0] + self.lanes[2]) + (self.lanes[1] + self.lanes[3])
    }
}

#[inline]
fn f16(b: &[u8], off: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

#[inline]
fn f32le(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Σ q[i] * a[i] with `a` holding i8 activations.
#[inline]
fn idot(q: &[i8], a: &[u8]) -> i32 {
    q.iter()
        .zip(a)
        .map(|(&q, &a)| q as i32 * (a as i8) as i32)
        .sum()
}

/// Σ (nibble of w[i]) * a[i]; `shift` 0 takes the low nibbles, 4 the high ones.
#[inline]
fn nibble_dot(w: &[u8], shift: u32, a: &[u8]) -> i32 {
    w.iter()
        .zip(a)
        .map(|(&w, &a)| ((w >> shift) & 15) as i32 * (a as i8) as i32)
        .sum()
}

/// Q8_0 (34 B / 32) · Q8_0.
pub fn q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = Lanes::default();
    for (wb, ab) in w.chunks_exact(34).zip(a.chunks_exact(34)).take(n / 32) {
        let wq: &[u8] = &wb[2..34];
        let s: i32 = wq
            .iter()
            .zip(&ab[2..34])
            .map(|(&w, &a)| (w as i8) as i32 * (a as i8) as i32)
            .sum();
        sum.add(s as f32 * (f16(wb, 0) * f16(ab, 0)));
    }
    sum.total()
}

/// Q4_1 (20 B / 32: d, m, nibbles) · Q8_1 (36 B: d, s, qs).
pub fn q4_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = Lanes::default();
    for (wb, ab) in w.chunks_exact(20).zip(a.chunks_exact(36)).take(n / 32) {
        let qs = &wb[4..20];
        let aq = &ab[4..36];
        let s = nibble_dot(qs, 0, &aq[..16]) + nibble_dot(qs, 4, &aq[16..32]);
        sum.add((f16(wb, 0) * f16(ab, 0)) * s as f32 + f16(wb, 2) * f16(ab, 2));
    }
    sum.total()
}

/// Q5_0 (22 B / 32: d, qh u32, nibbles) · Q8_0.
pub fn q5_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = Lanes::default();
    for (wb, ab) in w.chunks_exact(22).zip(a.chunks_exact(34)).take(n / 32) {
        let qh = u32::from_le_bytes([wb[2], wb[3], wb[4], wb[5]]);
        let qs = &wb[6..22];
        let mut q = [0i8; 32];
        for j in 0..16 {
            q[j] = ((qs[j] & 15) | ((((qh >> j) & 1) as u8) << 4)) as i8 - 16;
            q[j + 16] = ((qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4)) as i8 - 16;
        }
        let s = idot(&q, &ab[2..34]);
        sum.add((f16(wb, 0) * f16(ab, 0)) * s as f32);
    }
    sum.total()
}

/// Q4_K (144 B / 256) · Q8_K (292 B: d f32, qs[256], bsums i16[16]).
pub fn q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = Lanes::default();
    for (wb, ab) in w.chunks_exact(144).zip(a.chunks_exact(292)).take(n / 256) {
        let (sc, mn) = minfer_gguf::quants::unpack_scale_min_k4(&wb[4..16]);
        let qs = &wb[16..144];
        let aq = &ab[4..260];
        let mut isum = 0i32;
        for k in 0..4 {
            let q = &qs[32 * k..32 * k + 32];
            let lo = nibble_dot(q, 0, &aq[64 * k..64 * k + 32]);
            let hi = nibble_dot(q, 4, &aq[64 * k + 32..64 * k + 64]);
            isum += sc[2 * k] as i32 * lo + sc[2 * k + 1] as i32 * hi;
        }
        let mut msum = 0i32;
        for j in 0..16 {
            msum +=
                i16::from_le_bytes([ab[260 + 2 * j], ab[261 + 2 * j]]) as i32 * mn[j / 2] as i32;
        }
        let ad = f32le(ab, 0);
        let d = f16(wb, 0) * ad;
        let dmin = f16(wb, 2) * ad;
        sum.add(d * isum as f32 - dmin * msum as f32);
    }
    sum.total()
}

/// Q6_K (210 B / 256: ql[128], qh[64], scales i8[16], d) · Q8_K.
pub fn q6_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = Lanes::default();
    for (wb, ab) in w.chunks_exact(210).zip(a.chunks_exact(292)).take(n / 256) {
        let (ql, qh) = (&wb[0..128], &wb[128..192]);
        let aq = &ab[4..260];
        let mut isum = 0i32;
        for h in 0..2 {
            for quarter in 0..4 {
                // Elements 128h + 32*quarter + l, l < 32: two 16-element sub-blocks.
                let lo = &ql[64 * h + 32 * (quarter % 2)..][..32];
                let hi = &qh[32 * h..][..32];
                let (ls, hs) = (4 * (quarter / 2), 2 * quarter);
                let base = 128 * h + 32 * quarter;
                let q =
                    |l: usize| ((((lo[l] >> ls) & 15) | (((hi[l] >> hs) & 3) << 4)) as i32) - 32;
                let mut s0 = 0i32;
                let mut s1 = 0i32;
                for l in 0..16 {
                    s0 += q(l) * (aq[base + l] as i8) as i32;
                    s1 += q(l + 16) * (aq[base + 16 + l] as i8) as i32;
                }
                let sb = base / 16;
                isum += (wb[192 + sb] as i8) as i32 * s0 + (wb[193 + sb] as i8) as i32 * s1;
            }
        }
        sum.add(f16(wb, 208) * f32le(ab, 0) * isum as f32);
    }
    sum.total()
}
