//! The tensor-core int8 matmul (`mf_mmq_*`, kernels/mmq.cu) against the dp4a one
//! (`mf_mmvq_*`) and against a host model of the canonical block order (ADR 0008), on the
//! same random weights and quantized activations: every weight type, every tile shape, rows
//! of 896 / 4864 / 160 (Q8_0, Q4_0, Q4_1, Q5_0) and 4864 / 1024 / 256 (Q4_K, Q6_K), 200
//! outputs (no tile divides it), 1, 17, 64 and 300 tokens; bit for bit. Controls: the same
//! block products summed in plain block order differ from the kernels' bits, and one
//! changed weight byte changes exactly its row's outputs. The generation rows' tensor-core
//! kernels (`mf_mmvt*`, a warp per residue) meet the same host model at every tile and count,
//! and so do the one-token kernels (`mf_mmvq1*`, the plain and the pipelined walks).
//! SKIP (pass) without a CUDA device.

#![cfg(feature = "cuda")]

use minfer_cuda::device::{Arg, Gpu};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Ty {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q4K,
    Q6K,
}

impl Ty {
    const ALL: [Ty; 6] = [Ty::Q8_0, Ty::Q4_0, Ty::Q4_1, Ty::Q5_0, Ty::Q4K, Ty::Q6K];
    fn name(self) -> &'static str {
        match self {
            Ty::Q8_0 => "q8_0",
            Ty::Q4_0 => "q4_0",
            Ty::Q4_1 => "q4_1",
            Ty::Q5_0 => "q5_0",
            Ty::Q4K => "q4_k",
            Ty::Q6K => "q6_k",
        }
    }
    /// (elements, bytes) of a storage block.
    fn block(self) -> (usize, usize) {
        match self {
            Ty::Q8_0 => (32, 34),
            Ty::Q4_0 => (32, 18),
            Ty::Q4_1 => (32, 20),
            Ty::Q5_0 => (32, 22),
            Ty::Q4K => (256, 144),
            Ty::Q6K => (256, 210),
        }
    }
    /// The kernels' type code (kernels/common.cuh `MF_Q*`).
    fn code(self) -> i32 {
        match self {
            Ty::Q8_0 => 2,
            Ty::Q4_0 => 3,
            Ty::Q4_1 => 4,
            Ty::Q5_0 => 5,
            Ty::Q4K => 6,
            Ty::Q6K => 7,
        }
    }
    fn row_bytes(self, ne0: usize) -> usize {
        let (e, b) = self.block();
        ne0 / e * b
    }
    /// Byte offsets of the f16 scales inside a storage block.
    fn f16_fields(self) -> &'static [usize] {
        match self {
            Ty::Q8_0 | Ty::Q4_0 | Ty::Q5_0 => &[0],
            Ty::Q4_1 | Ty::Q4K => &[0, 2],
            Ty::Q6K => &[208],
        }
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    fn unit(&mut self) -> f32 {
        self.next() as f32 / (1u64 << 31) as f32 * 2.0 - 1.0
    }
}

/// A normal f16 with exponent 2^-7 .. 2^-2 and a random sign and mantissa.
fn rand_f16(r: &mut Rng) -> u16 {
    let v = r.next();
    let sign = (v & 1) as u16;
    let exp = 8 + (v >> 1) % 6;
    let man = (v >> 8) & 0x3ff;
    (sign << 15) | ((exp as u16) << 10) | man as u16
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    assert!(exp != 0 && exp != 31, "test scales are normal f16");
    f32::from_bits(sign | ((exp + 127 - 15) << 23) | (man << 13))
}

fn weights(ty: Ty, ne0: usize, n_out: usize, r: &mut Rng) -> Vec<u8> {
    let (_, bb) = ty.block();
    let mut w: Vec<u8> = (0..ty.row_bytes(ne0) * n_out)
        .map(|_| r.next() as u8)
        .collect();
    for blk in w.chunks_exact_mut(bb) {
        for &o in ty.f16_fields() {
            blk[o..o + 2].copy_from_slice(&rand_f16(r).to_le_bytes());
        }
    }
    w
}

/// One 32-element block quantized as `mf_q8_block` does: q = round-half-even(x / d),
/// d = max|x| / 127, and (d, d * sum q).
fn quantize(x: &[f32]) -> (Vec<i8>, (f32, f32)) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let q: Vec<i8> = x
        .iter()
        .map(|&v| {
            if d > 0.0 {
                (v / d).round_ties_even() as i8
            } else {
                0
            }
        })
        .collect();
    let s: i32 = q.iter().map(|&v| v as i32).sum();
    (q, (d, d * s as f32))
}

/// A weight block as int8 values and its scale terms (f1, f2, i1, i2).
type Unpacked = ([i32; 32], f32, f32, i32, i32);

/// Block `b` of a row, the host model of `mf_wload`.
fn unpack(ty: Ty, row: &[u8], b: usize) -> Unpacked {
    let h = |p: &[u8], o: usize| f16_to_f32(u16::from_le_bytes([p[o], p[o + 1]]));
    let mut q = [0i32; 32];
    let (mut f2, mut i1, mut i2) = (0f32, 0, 0);
    let f1;
    match ty {
        Ty::Q8_0 => {
            let p = &row[b * 34..];
            f1 = h(p, 0);
            for (i, v) in q.iter_mut().enumerate() {
                *v = p[2 + i] as i8 as i32;
            }
        }
        Ty::Q4_0 | Ty::Q4_1 => {
            let (bb, off) = if ty == Ty::Q4_0 { (18, 2) } else { (20, 4) };
            let p = &row[b * bb..];
            f1 = h(p, 0);
            if ty == Ty::Q4_1 {
                f2 = h(p, 2);
            }
            for i in 0..16 {
                q[i] = (p[off + i] & 15) as i32;
                q[16 + i] = (p[off + i] >> 4) as i32;
            }
        }
        Ty::Q5_0 => {
            let p = &row[b * 22..];
            f1 = h(p, 0);
            let qh = u32::from_le_bytes([p[2], p[3], p[4], p[5]]);
            for i in 0..16 {
                q[i] = ((p[6 + i] & 15) as u32 | (((qh >> i) & 1) << 4)) as i32;
                q[16 + i] = ((p[6 + i] >> 4) as u32 | (((qh >> (16 + i)) & 1) << 4)) as i32;
            }
        }
        Ty::Q4K => {
            let p = &row[(b / 8) * 144..];
            let s = b % 8;
            let k = &p[4..16];
            let (sc, mn) = if s < 4 {
                (k[s] & 63, k[s + 4] & 63)
            } else {
                (
                    (k[s + 4] & 15) | ((k[s - 4] >> 6) << 4),
                    (k[s + 4] >> 4) | ((k[s] >> 6) << 4),
                )
            };
            f1 = h(p, 0) * sc as f32;
            f2 = h(p, 2) * mn as f32;
            let qs = &p[16 + 32 * (s / 2)..];
            for (i, v) in q.iter_mut().enumerate() {
                *v = ((qs[i] >> (4 * (s % 2))) & 15) as i32;
            }
        }
        Ty::Q6K => {
            let p = &row[(b / 8) * 210..];
            let s = b % 8;
            let (hh, j) = (s / 4, s % 4);
            let ql = &p[64 * hh + 32 * (j % 2)..];
            let qh = &p[128 + 32 * hh..];
            for (i, v) in q.iter_mut().enumerate() {
                let lo = (ql[i] >> (4 * (j / 2))) & 15;
                let hi = (qh[i] >> (2 * j)) & 3;
                *v = (lo | (hi << 4)) as i32 - 32;
            }
            f1 = h(p, 208);
            i1 = p[192 + 2 * s] as i8 as i32;
            i2 = p[193 + 2 * s] as i8 as i32;
        }
    }
    (q, f1, f2, i1, i2)
}

/// c_b as `mf_contrib` writes it (every operation rounded on its own; Rust f32 arithmetic
/// never contracts).
fn contrib(ty: Ty, u: &Unpacked, a: i32, b: i32, (dx, sx): (f32, f32)) -> f32 {
    let &(_, f1, f2, i1, i2) = u;
    match ty {
        Ty::Q8_0 => f1 * dx * (a + b) as f32,
        Ty::Q4_0 => f1 * (dx * (a + b) as f32 - 8.0 * sx),
        Ty::Q4_1 => f1 * dx * (a + b) as f32 + f2 * sx,
        Ty::Q5_0 => f1 * (dx * (a + b) as f32 - 16.0 * sx),
        Ty::Q4K => f1 * dx * (a + b) as f32 - f2 * sx,
        Ty::Q6K => f1 * dx * (i1 * a + i2 * b) as f32,
    }
}

/// Every output's block contributions, c[t][o][b].
#[allow(clippy::too_many_arguments)]
fn contributions(
    ty: Ty,
    w: &[u8],
    xq: &[i8],
    ds: &[(f32, f32)],
    ne0: usize,
    n_out: usize,
    nt: usize,
) -> Vec<Vec<Vec<f32>>> {
    let nb = ne0 / 32;
    let rb = ty.row_bytes(ne0);
    let rows: Vec<Vec<_>> = (0..n_out)
        .map(|o| {
            (0..nb)
                .map(|b| unpack(ty, &w[o * rb..(o + 1) * rb], b))
                .collect()
        })
        .collect();
    (0..nt)
        .map(|t| {
            rows.iter()
                .map(|row| {
                    row.iter()
                        .enumerate()
                        .map(|(b, u)| {
                            let x = &xq[t * ne0 + b * 32..t * ne0 + b * 32 + 32];
                            let dot = |r: std::ops::Range<usize>| -> i32 {
                                r.map(|i| u.0[i] * x[i] as i32).sum()
                            };
                            contrib(ty, u, dot(0..16), dot(16..32), ds[t * nb + b])
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// The canonical order: P_r over b = r, r + 8, ... from +0, then
/// ((P0+P4)+(P2+P6))+((P1+P5)+(P3+P7)), then the bias.
fn canonical(c: &[f32], bias: Option<f32>) -> f32 {
    let mut p = [0f32; 8];
    for (b, v) in c.iter().enumerate() {
        p[b % 8] += v;
    }
    let s = ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
    bias.map_or(s, |v| s + v)
}

/// The control's order: the blocks summed one after another.
fn in_block_order(c: &[f32], bias: Option<f32>) -> f32 {
    let s = c.iter().fold(0f32, |a, v| a + v);
    bias.map_or(s, |v| s + v)
}

fn f32s(v: &[u8]) -> Vec<f32> {
    v.chunks_exact(4)
        .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Device buffers of one case.
struct Case {
    w: u64,
    xq: u64,
    xds: u64,
    bias: u64,
    y: u64,
    /// Scratch for split passes: 8 x n_out x nt floats.
    part: u64,
    ne0: usize,
    n_out: usize,
    nt: usize,
    rb: usize,
}

/// The dp4a kernel (`tile` None) or an `mma` one with `tile` and its passes in `split`
/// groups (then joined by `mf_mmq_combine` through `part`).
fn matmul(g: &Gpu, kernel: &str, c: &Case, tile: Option<(usize, usize)>, split: usize) -> Vec<u32> {
    let (grid, threads) = match tile {
        Some((rows, toks)) => ((c.n_out.div_ceil(rows), c.nt.div_ceil(toks)), 256),
        None => ((c.n_out.div_ceil(16), c.nt.div_ceil(8)), 128),
    };
    let n = c.n_out * c.nt;
    g.memset0(c.y, n * 4).unwrap();
    let mut args = vec![
        Arg::U64(c.w),
        Arg::U64(c.rb as u64),
        Arg::U64(c.xq),
        Arg::U64(c.xds),
        Arg::U64(c.y),
        Arg::U64(c.bias),
        Arg::I32(c.ne0 as i32),
        Arg::I32(c.n_out as i32),
        Arg::I32(c.nt as i32),
    ];
    if tile.is_some() {
        args.extend([Arg::I32(split as i32), Arg::U64(c.part)]);
    }
    let z = if tile.is_some() { split as u32 } else { 1 };
    g.launch(kernel, (grid.0 as u32, grid.1 as u32, z), threads, &args)
        .unwrap();
    if tile.is_some() && split > 1 {
        g.launch(
            "mf_mmq_combine",
            (n.div_ceil(256) as u32, 1, 1),
            256,
            &[
                Arg::U64(c.part),
                Arg::U64(c.y),
                Arg::U64(c.bias),
                Arg::U64(n as u64),
                Arg::I32(c.n_out as i32),
                Arg::I32(split as i32),
            ],
        )
        .unwrap();
    }
    let mut out = vec![0u8; n * 4];
    g.download(c.y, &mut out).unwrap();
    f32s(&out).iter().map(|v| v.to_bits()).collect()
}

/// A one-token kernel (`mf_mmvq1*`, kernels/mmvq.cu: a warp per row, 8 rows a block) over
/// token 0 of the case with its weights at `w` and `blocks` blocks (fewer than the rows'
/// blocks: each warp walks several rows, as the host's one resident wave makes it), x as the
/// `_gx` kernels read it (quantized) or, with `xf`, the f32 row the others quantize per block.
fn one_token(
    g: &Gpu,
    kernel: &str,
    ty: Ty,
    c: &Case,
    w: u64,
    xf: Option<u64>,
    blocks: usize,
) -> Vec<u32> {
    g.memset0(c.y, c.n_out * 4).unwrap();
    let mut args = vec![Arg::I32(ty.code()), Arg::U64(w), Arg::U64(c.rb as u64)];
    match xf {
        Some(x) => args.extend([Arg::U64(x), Arg::U64(0), Arg::F32(0.0)]),
        None => args.extend([Arg::U64(c.xq), Arg::U64(c.xds)]),
    }
    args.extend([
        Arg::U64(c.y),
        Arg::U64(c.bias),
        Arg::U64(0),
        Arg::I32(c.ne0 as i32),
        Arg::I32(c.n_out as i32),
    ]);
    let shared = if xf.is_some() {
        (c.ne0 + c.ne0 / 4) as u32
    } else {
        0
    };
    g.launch_shared(kernel, (blocks as u32, 1, 1), 256, shared, &args)
        .unwrap();
    let mut out = vec![0u8; c.n_out * 4];
    g.download(c.y, &mut out).unwrap();
    f32s(&out).iter().map(|v| v.to_bits()).collect()
}

/// The tensor-core generation kernels (`mf_mmvt<k>[_m2]`: 16 or 32 weight rows x 8 to 64
/// tokens a block): name, weight rows and tokens a block, threads.
const MVT: [(&str, usize, usize, u32); 7] = [
    ("mf_mmvt1", 16, 8, 256),
    ("mf_mmvt2", 16, 16, 256),
    ("mf_mmvt4", 16, 32, 256),
    ("mf_mmvt8", 16, 64, 512),
    ("mf_mmvt1_m2", 32, 8, 256),
    ("mf_mmvt2_m2", 32, 16, 256),
    ("mf_mmvt4_m2", 32, 32, 512),
];

/// A generation-row kernel over the case, with its weights at `w`: `kernel` with `rows`
/// weight rows and `toks` tokens a block and `threads`, its first argument the type code
/// where `ty` is given (the `mf_mmvt*` kernels; the `mf_mmvs*` ones carry it in their name).
fn rows_kernel(
    g: &Gpu,
    kernel: &str,
    (rows, toks, threads): (usize, usize, u32),
    ty: Option<Ty>,
    c: &Case,
    w: u64,
) -> Vec<u32> {
    let n = c.n_out * c.nt;
    g.memset0(c.y, n * 4).unwrap();
    let grid = (c.nt.div_ceil(toks) as u32, c.n_out.div_ceil(rows) as u32, 1);
    let mut args: Vec<Arg> = ty.map(|t| Arg::I32(t.code())).into_iter().collect();
    args.extend([
        Arg::U64(w),
        Arg::U64(c.rb as u64),
        Arg::U64(c.xq),
        Arg::U64(c.xds),
        Arg::U64(c.y),
        Arg::U64(c.bias),
        Arg::I32(c.ne0 as i32),
        Arg::I32(c.n_out as i32),
        Arg::I32(c.nt as i32),
    ]);
    g.launch(kernel, grid, threads, &args).unwrap();
    let mut out = vec![0u8; n * 4];
    g.download(c.y, &mut out).unwrap();
    f32s(&out).iter().map(|v| v.to_bits()).collect()
}

/// The staged tensor-core generation kernels (`mf_mmvs<k>_<shape>_<type>`: 8 k tokens a
/// block; r1: 32 weight rows, 8 warps; r2: 64 rows, 16 warps; w16: 32 rows, 16 warps of one
/// m16 tile): name prefix, weight rows, tokens and threads a block.
const MVS: [(&str, usize, usize, u32); 9] = [
    ("mf_mmvs1_r1", 32, 8, 256),
    ("mf_mmvs1_r2", 64, 8, 512),
    ("mf_mmvs1_w16", 32, 8, 512),
    ("mf_mmvs2_r1", 32, 16, 256),
    ("mf_mmvs2_r2", 64, 16, 512),
    ("mf_mmvs2_w16", 32, 16, 512),
    ("mf_mmvs4_r1", 32, 32, 256),
    ("mf_mmvs4_r2", 64, 32, 512),
    ("mf_mmvs4_w16", 32, 32, 512),
];

/// Whether the staged kernel with `rows` x `toks` exists for `ty` (two stages in 48 KiB; the
/// host's rule in matvec.rs) and copies weights at `w` with rows of `rb` bytes and `ne0`
/// values (16-byte units: base aligned, rows too but for Q6_K's, an even number of blocks).
fn mvs_takes(ty: Ty, rows: usize, toks: usize, w: u64, rb: usize, ne0: usize) -> bool {
    let stride: usize = match ty {
        Ty::Q8_0 => 272,
        Ty::Q4_0 | Ty::Q4K => 144,
        Ty::Q4_1 | Ty::Q5_0 => 176,
        Ty::Q6K => 240,
    };
    2 * (rows * stride + toks * 336) <= 48 * 1024
        && w.is_multiple_of(16)
        && (ty == Ty::Q6K || rb.is_multiple_of(16))
        && ne0.is_multiple_of(64)
}

const TILES: [(&str, (usize, usize)); 4] = [
    ("", (64, 64)),
    ("_r128", (128, 64)),
    ("_t32", (64, 32)),
    ("_k8", (64, 64)),
];

#[test]
fn mma_matmuls_are_bitwise_the_dp4a_ones_and_the_canonical_order() {
    if let Err(why) = minfer_cuda::available() {
        println!("SKIP: no CUDA device ({why})");
        return;
    }
    let mut g = Gpu::new().unwrap();
    let mut r = Rng(0x5eed);
    let n_out = 200;
    let mut order_differs = 0usize;
    let mut checked = 0usize;
    let mut mvt_checked = 0usize;
    let mut one_token_checked = 0usize;
    let mut mvs_checked = [0usize; 8]; // staged outputs by type code
    for ty in Ty::ALL {
        let rows: &[usize] = match ty {
            Ty::Q4K | Ty::Q6K => &[4864, 1024, 256],
            _ => &[896, 4864, 160],
        };
        for (si, &ne0) in rows.iter().enumerate() {
            let nb = ne0 / 32;
            let w = weights(ty, ne0, n_out, &mut r);
            let bias: Vec<f32> = (0..n_out).map(|_| r.unit()).collect();
            let with_bias = si == 1;
            let nt_max = 300;
            let mut x: Vec<f32> = (0..nt_max * ne0).map(|_| r.unit() * 3.0).collect();
            x[..32].fill(0.0); // an all-zero block: d = 0
                               // Quantized on the device by mf_quantize_q8 (the kernels' input) and on the host
                               // (the model's): the same formula, checked equal below.
            let xd = g.alloc(x.len() * 4).unwrap();
            g.upload(xd, &bytes(&x)).unwrap();
            let q_bytes = (ne0 * nt_max).next_multiple_of(256);
            let xq = g.alloc(q_bytes + nt_max * nb * 8).unwrap();
            let xds = xq + q_bytes as u64;
            g.launch(
                "mf_quantize_q8",
                ((8 * nt_max * nb).div_ceil(128) as u32, 1, 1),
                128,
                &[
                    Arg::U64(xd),
                    Arg::U64(xq),
                    Arg::U64(xds),
                    Arg::I32(ne0 as i32),
                    Arg::I32(nt_max as i32),
                ],
            )
            .unwrap();
            let mut hq = Vec::with_capacity(x.len());
            let mut hds = Vec::with_capacity(nt_max * nb);
            for blk in x.chunks_exact(32) {
                let (q, ds) = quantize(blk);
                hq.extend(q);
                hds.push(ds);
            }
            let mut dq = vec![0u8; ne0 * nt_max];
            g.download(xq, &mut dq).unwrap();
            assert!(
                dq.iter().zip(&hq).all(|(&a, &b)| a as i8 == b),
                "{ty:?} {ne0}: the device quantizer and its host model agree"
            );
            let wd = g.alloc(w.len()).unwrap();
            g.upload(wd, &w).unwrap();
            // The same weights 4 bytes past an aligned address.
            let wd_off = g.alloc(w.len() + 16).unwrap();
            g.upload(wd_off + 4, &w).unwrap();
            let bd = g.alloc(n_out * 4).unwrap();
            g.upload(bd, &bytes(&bias)).unwrap();
            let yd = g.alloc(n_out * nt_max * 4).unwrap();
            let pd = g.alloc(8 * n_out * nt_max * 4).unwrap();
            let contribs = contributions(ty, &w, &hq, &hds, ne0, n_out, nt_max);
            for nt in [1usize, 17, 64, 300] {
                let case = Case {
                    w: wd,
                    xq,
                    xds,
                    bias: if with_bias { bd } else { 0 },
                    y: yd,
                    part: pd,
                    ne0,
                    n_out,
                    nt,
                    rb: ty.row_bytes(ne0),
                };
                let b = |o: usize| with_bias.then(|| bias[o]);
                let want: Vec<u32> = (0..nt * n_out)
                    .map(|i| canonical(&contribs[i / n_out][i % n_out], b(i % n_out)).to_bits())
                    .collect();
                order_differs += (0..nt * n_out)
                    .filter(|&i| {
                        in_block_order(&contribs[i / n_out][i % n_out], b(i % n_out)).to_bits()
                            != want[i]
                    })
                    .count();
                let dp4a = matmul(&g, &format!("mf_mmvq_{}", ty.name()), &case, None, 1);
                let bad = (0..want.len()).filter(|&i| dp4a[i] != want[i]).count();
                assert_eq!(bad, 0, "{ty:?} {ne0} nt {nt}: dp4a vs the host model");
                // The generation-row tensor-core kernels, every tile at every count (slots
                // past nt repeat its last token); Q4_K also from a base that is not 16-byte
                // aligned (its header then comes in bytes).
                for k in MVT {
                    let mut bases = vec![(wd, "")];
                    if ty == Ty::Q4K {
                        bases.push((wd_off + 4, " at +4"));
                    }
                    for (base, at) in bases {
                        let got = rows_kernel(&g, k.0, (k.1, k.2, k.3), Some(ty), &case, base);
                        let bad: Vec<usize> =
                            (0..want.len()).filter(|&i| got[i] != want[i]).collect();
                        if let Some(&i) = bad.first() {
                            println!(
                                "{}{at} {ty:?} {ne0} nt {nt}: {} of {} differ; first token {} row {}: {} vs {}",
                                k.0,
                                bad.len(),
                                want.len(),
                                i / n_out,
                                i % n_out,
                                f32::from_bits(got[i]),
                                f32::from_bits(want[i])
                            );
                        }
                        assert!(bad.is_empty(), "{}{at} {ty:?} {ne0} nt {nt}", k.0);
                        mvt_checked += want.len();
                    }
                }
                // The one-token kernels, plain and pipelined walks (`_p4`: Q4_K, `_p6`: Q6_K,
                // where the host picks them: matvec.rs `mv1_walk`), x quantized before them or
                // per block, on one block (every warp walks 25 rows), 3 and a block per 8 rows;
                // Q4_K and Q6_K also 4 bytes past an aligned base (the plain walks' narrow
                // loads; Q6_K's pipelined walk too, its rows only need even addresses).
                if nt == 1 {
                    let walks: &[(&str, bool)] = match ty {
                        Ty::Q4K => &[("mf_mmvq1", true), ("mf_mmvq1_p4", false)],
                        Ty::Q6K => &[("mf_mmvq1", true), ("mf_mmvq1_p6", true)],
                        _ => &[("mf_mmvq1", true)],
                    };
                    for &(walk, off_too) in walks {
                        let mut bases = vec![(wd, "")];
                        if off_too && matches!(ty, Ty::Q4K | Ty::Q6K) {
                            bases.push((wd_off + 4, " at +4"));
                        }
                        for (base, at) in bases {
                            for (gx, xf) in [("_gx", None), ("", Some(xd))] {
                                let k = format!("{walk}{gx}");
                                for blocks in [1, 3, n_out.div_ceil(8)] {
                                    let got = one_token(&g, &k, ty, &case, base, xf, blocks);
                                    let bad = (0..n_out).filter(|&i| got[i] != want[i]).count();
                                    assert_eq!(bad, 0, "{k}{at} {ty:?} {ne0}, {blocks} blocks");
                                    one_token_checked += n_out;
                                }
                            }
                        }
                    }
                }
                // The staged kernels: every tile the type has, at every count, where the
                // weights' alignment lets them copy (Q6_K's rows of 4,864 values, 3,990 bytes,
                // start at every even offset of a unit; rows of 896 values leave a last chunk
                // of 4 blocks).
                for k in MVS {
                    if !mvs_takes(ty, k.1, k.2, wd, case.rb, ne0) {
                        continue;
                    }
                    let name = format!("{}_{}", k.0, ty.name());
                    let got = rows_kernel(&g, &name, (k.1, k.2, k.3), None, &case, wd);
                    let bad: Vec<usize> = (0..want.len()).filter(|&i| got[i] != want[i]).collect();
                    if let Some(&i) = bad.first() {
                        println!(
                            "{}_{} {ne0} nt {nt}: {} of {} differ; first token {} row {}: {} vs {}",
                            k.0,
                            ty.name(),
                            bad.len(),
                            want.len(),
                            i / n_out,
                            i % n_out,
                            f32::from_bits(got[i]),
                            f32::from_bits(want[i])
                        );
                    }
                    assert!(bad.is_empty(), "{}_{} {ne0} nt {nt}", k.0, ty.name());
                    mvs_checked[ty.code() as usize] += want.len();
                }
                // Every tile whole, and the first tile with its passes split 2, 4 and 8 ways.
                let runs = TILES
                    .iter()
                    .map(|&(suffix, tile)| (suffix, tile, 1))
                    .chain([2, 4, 8].map(|s| (TILES[0].0, TILES[0].1, s)));
                for (suffix, tile, split) in runs {
                    let k = format!("mf_mmq_{}{suffix}", ty.name());
                    let mma = matmul(&g, &k, &case, Some(tile), split);
                    let bad: Vec<usize> = (0..want.len()).filter(|&i| mma[i] != dp4a[i]).collect();
                    if let Some(&i) = bad.first() {
                        println!(
                            "{k} split {split} {ne0} nt {nt}: {} of {} differ; first token {} row {}: {} vs {}",
                            bad.len(),
                            want.len(),
                            i / n_out,
                            i % n_out,
                            f32::from_bits(mma[i]),
                            f32::from_bits(dp4a[i])
                        );
                    }
                    assert!(
                        bad.is_empty(),
                        "{k} split {split} {ne0} nt {nt}: mma vs dp4a"
                    );
                    checked += want.len();
                }
            }
            // Control: one weight byte changed (block 0 of row 3) changes row 3's outputs
            // and no other row's.
            let mut w2 = w.clone();
            let rb = ty.row_bytes(ne0);
            let at = 3 * rb + if ty == Ty::Q6K { 0 } else { ty.block().1 - 1 };
            w2[at] ^= 0x11;
            g.upload(wd, &w2).unwrap();
            let case = Case {
                w: wd,
                xq,
                xds,
                bias: 0,
                y: yd,
                part: pd,
                ne0,
                n_out,
                nt: 64,
                rb,
            };
            let k = format!("mf_mmq_{}", ty.name());
            let before: Vec<u32> = (0..64 * n_out)
                .map(|i| canonical(&contribs[i / n_out][i % n_out], None).to_bits())
                .collect();
            let after = matmul(&g, &k, &case, Some((64, 64)), 1);
            let changed: Vec<usize> = (0..before.len())
                .filter(|&i| after[i] != before[i])
                .map(|i| i % n_out)
                .collect();
            println!(
                "{ty:?} rows of {ne0}: all tiles = dp4a = host model; one flipped byte \
                 changed {} outputs",
                changed.len()
            );
            assert!(
                !changed.is_empty(),
                "control: the flipped byte changed nothing"
            );
            assert!(
                changed.iter().all(|&o| o == 3),
                "control: only row 3 changes"
            );
        }
    }
    println!(
        "{checked} mma and {mvt_checked} generation-row mma outputs checked; plain block order \
         differs on {order_differs}"
    );
    println!("staged generation-row outputs checked by type code: {mvs_checked:?}");
    println!("one-token outputs checked: {one_token_checked}");
    assert!(one_token_checked > 0, "the one-token kernels ran");
    assert!(mvt_checked > 0, "the generation-row kernels ran");
    assert!(
        mvs_checked[2..].iter().all(|&n| n > 0),
        "the staged kernels ran for every type"
    );
    assert!(
        order_differs > 0,
        "control: the order of the float sum shows in the bits"
    );
}
