//! Rotary position embedding, NeoX (pairs `(i, i + d/2)`) and normal (pairs `(2i, 2i+1)`).
//!
//! Angles follow ggml's f32 recurrence: `theta_j = scale * pos * base^(-2j/d)`, computed
//! as a running product so results match llama.cpp closely.

use super::as_i32;
use minfer_graph::RopeStyle;

pub struct RopeParams {
    pub style: RopeStyle,
    pub n_head: usize,
    pub head_dim: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    /// Rotate as GCC compiles ggml's `x0*cos - x1*sin` / `x0*sin + x1*cos` on FMA machines:
    /// the first product fused with the rounded second (llama.cpp x86 numerics).
    pub fused: bool,
}

/// `x`/`out`: `[n_tokens][n_head * head_dim]`; `pos`: `[n_tokens]` positions (i32 bits).
pub fn rope(p: &RopeParams, x: &[f32], pos: &[f32], out: &mut [f32]) {
    let d = p.head_dim;
    let half = d / 2;
    let theta_scale = p.freq_base.powf(-2.0 / d as f32);
    let row = p.n_head * d;
    let mut cs = vec![(0f32, 0f32); half];
    for (t, (xr, or)) in x
        .chunks_exact(row)
        .zip(out.chunks_exact_mut(row))
        .enumerate()
    {
        let mut theta = as_i32(pos[t]) as f32;
        for c in cs.iter_mut() {
            let th = p.freq_scale * theta;
            *c = (th.cos(), th.sin());
            theta *= theta_scale;
        }
        for (xh, oh) in xr.chunks_exact(d).zip(or.chunks_exact_mut(d)) {
            for (j, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = match p.style {
                    RopeStyle::Neox => (j, j + half),
                    RopeStyle::Normal => (2 * j, 2 * j + 1),
                };
                let (x0, x1) = (xh[a], xh[b]);
                if p.fused {
                    oh[a] = x0.mul_add(c, -(x1 * s));
                    oh[b] = x0.mul_add(s, x1 * c);
                } else {
                    oh[a] = x0 * c - x1 * s;
                    oh[b] = x0 * s + x1 * c;
                }
            }
        }
    }
}
