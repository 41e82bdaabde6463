//! RMSNorm over groups of each row (a whole row, or one head for Qwen3's Q/K norm).

/// `out = x / sqrt(mean(x²) + eps) * w` per `w.len()`-element group.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let g = w.len();
    for (xr, or) in x.chunks_exact(g).zip(out.chunks_exact_mut(g)) {
        // Sum in f64 as ggml does, then scale in f32.
        let ss: f64 = xr.iter().map(|&v| (v * v) as f64).sum();
        let mean = (ss / g as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, v), wv) in or.iter_mut().zip(xr).zip(w) {
            *o = (v * scale) * wv;
        }
    }
}
