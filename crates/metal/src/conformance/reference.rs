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

/// RoPE of one head vector at `pos`.
pub fn rope(x: &[f32], pos: i32, n_rot: usize, base: f32, interleaved: bool) -> Vec<f64> {
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for i in 0..n_rot / 2 {
        let theta = pos as f64 * (base as f64).powf(-2.0 * i as f64 / n_rot as f64);
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
