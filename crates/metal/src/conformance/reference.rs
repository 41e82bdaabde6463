//! Scalar references in f64 (independent of the kernels' structure and order).

/// RMSNorm of one row.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(&v, &g)| v as f64 * s * g as f64)
        .collect()
}

/// RoPE of one head vector at `pos`: pair `i` turns by `freq_scale * pos * base^(-2i/n_rot)`.
pub fn rope(
    x: &[f32],
    pos: i32,
    n_rot: usize,
    base: f32,
    freq_scale: f32,
    interleaved: bool,
) -> Vec<f64> {
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for i in 0..n_rot / 2 {
        let theta =
            freq_scale as f64 * pos as f64 * (base as f64).powf(-2.0 * i as f64 / n_rot as f64);
        let (s, c) = theta.sin_cos();
        let (a, b) = if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + n_rot / 2)
        };
        let (x0, x1) = (x[a] as f64, x[b] as f64);
        out[a] = x0 * c - x1 * s;
        out[b] = x0 * s + x1 * c;
    }
    out
}

/// Causal GQA attention: q `[nt, nh*hd]`, k/v rows `[n_ctx, nkv_h*hd]` (already in the
/// values the device holds), token t attends rows `0..=pos[t]`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    pos: &[i32],
    nh: usize,
    nkv_h: usize,
    hd: usize,
) -> Vec<f64> {
    let stride = nkv_h * hd;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = Vec::with_capacity(pos.len() * nh * hd);
    for (t, &p) in pos.iter().enumerate() {
        for h in 0..nh {
            let hk = h / (nh / nkv_h);
            let qr = &q[(t * nh + h) * hd..][..hd];
            let n = p as usize + 1;
            let s: Vec<f64> = (0..n)
                .map(|j| {
                    let kr = &k[j * stride + hk * hd..][..hd];
                    qr.iter()
                        .zip(kr)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|&x| (x - m).exp()).collect();
            let l: f64 = w.iter().sum();
            for d in 0..hd {
                let acc: f64 = (0..n)
                    .map(|j| w[j] * v[j * stride + hk * hd + d] as f64)
                    .sum();
                out.push(acc / l);
            }
        }
    }
    out
}

/// RoPE of one head vector (every dimension rotated) in f32, step for step as the CPU backend
/// computes it (`crates/cpu/src/ops/rope.rs`, non-fused): `theta_0 = pos`, each next angle the
/// previous times `base^(-2/hd)` rounded to f32, turned by `freq_scale * theta`.
pub fn rope_cpu_f32(
    x: &[f32],
    pos: i32,
    base: f32,
    freq_scale: f32,
    interleaved: bool,
) -> Vec<f32> {
    let d = x.len();
    let half = d / 2;
    let ts = base.powf(-2.0 / d as f32);
    let mut theta = pos as f32;
    let mut out = x.to_vec();
    for j in 0..half {
        let th = freq_scale * theta;
        let (c, s) = (th.cos(), th.sin());
        theta *= ts;
        let (a, b) = if interleaved {
            (2 * j, 2 * j + 1)
        } else {
            (j, j + half)
        };
        let (x0, x1) = (x[a], x[b]);
        out[a] = x0 * c - x1 * s;
        out[b] = x0 * s + x1 * c;
    }
    out
}

/// GQA attention over explicit windows: `cells[t]` lists query t's cells in logical order;
/// k/v rows `[n_cells][nkv_h * hd]` (the values the device holds); scores scaled by `scale`.
/// An empty window gives zeros.
#[allow(clippy::too_many_arguments)]
pub fn window_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    cells: &[Vec<usize>],
    nh: usize,
    nkv_h: usize,
    hd: usize,
    scale: f32,
) -> Vec<f64> {
    let stride = nkv_h * hd;
    let mut out = Vec::with_capacity(cells.len() * nh * hd);
    for (t, list) in cells.iter().enumerate() {
        for h in 0..nh {
            let hk = h / (nh / nkv_h);
            let qr = &q[(t * nh + h) * hd..][..hd];
            let s: Vec<f64> = list
                .iter()
                .map(|&c| {
                    let kr = &k[c * stride + hk * hd..][..hd];
                    qr.iter()
                        .zip(kr)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|&x| (x - m).exp()).collect();
            let l: f64 = w.iter().sum();
            for d in 0..hd {
                if list.is_empty() {
                    out.push(0.0);
                    continue;
                }
                let acc: f64 = list
                    .iter()
                    .zip(&w)
                    .map(|(&c, &wj)| wj * v[c * stride + hk * hd + d] as f64)
                    .sum();
                out.push(acc / l);
            }
        }
    }
    out
}
