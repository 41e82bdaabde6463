//! The reference forward: plain f64 arithmetic over dequantized weights, no graph, no
//! caching tricks, full causal attention recomputed from scratch. It is the oracle the graph
//! path is tested against on small synthetic models; it is slow on purpose.

use crate::arch::{names, names::Layer, HParams};
use crate::error::{Error, Result};
use crate::tensors::output_weight_name;
use minfer_gguf::{quants, GgufModel};
use minfer_graph::RopeStyle;

/// A weight dequantized to f64, `rows` rows of `cols`.
struct Mat {
    rows: usize,
    cols: usize,
    w: Vec<f64>,
}

fn load(model: &GgufModel, name: &str) -> Result<Mat> {
    let (info, bytes) = model.tensor_data(name)?;
    let cols = info.dims[0] as usize;
    let rows = (info.n_elements() / info.dims[0]) as usize;
    let mut f = vec![0f32; cols * rows];
    quants::dequantize_row(info.ty, bytes, &mut f)?;
    Ok(Mat {
        rows,
        cols,
        w: f.into_iter().map(f64::from).collect(),
    })
}

impl Mat {
    /// `W x` for `x` of `cols`.
    fn apply(&self, x: &[f64]) -> Vec<f64> {
        (0..self.rows)
            .map(|r| {
                self.w[r * self.cols..(r + 1) * self.cols]
                    .iter()
                    .zip(x)
                    .map(|(a, b)| a * b)
                    .sum()
            })
            .collect()
    }
    fn row(&self, r: usize) -> &[f64] {
        &self.w[r * self.cols..(r + 1) * self.cols]
    }
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, g)| v * s * g).collect()
}

fn rope(x: &mut [f64], pos: usize, hd: usize, style: RopeStyle, base: f64, scale: f64) {
    for head in x.chunks_exact_mut(hd) {
        for j in 0..hd / 2 {
            let theta = scale * pos as f64 * base.powf(-2.0 * j as f64 / hd as f64);
            let (c, s) = (theta.cos(), theta.sin());
            let (a, b) = match style {
                RopeStyle::Neox => (j, j + hd / 2),
                RopeStyle::Normal => (2 * j, 2 * j + 1),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * c - x1 * s;
            head[b] = x0 * s + x1 * c;
        }
    }
}

fn add_bias(x: &mut [f64], b: &Option<Mat>) {
    if let Some(b) = b {
        for (v, bv) in x.iter_mut().zip(&b.w) {
            *v += bv;
        }
    }
}

/// Logits (vocab-sized) for every position of `tokens`, the sequence starting at position 0.
pub fn forward(model: &GgufModel, hp: &HParams, tokens: &[u32]) -> Result<Vec<Vec<f64>>> {
    let (hd, nh, nkv) = (hp.head_dim, hp.head_count, hp.head_count_kv);
    let eps = hp.rms_epsilon as f64;
    let (base, scale) = (hp.rope_freq_base as f64, 1.0 / hp.rope_scale as f64);
    let style = hp.arch.rope_style();
    let embd = load(model, names::TOKEN_EMBD)?;
    let nt = tokens.len();
    let mut xs: Vec<Vec<f64>> = Vec::with_capacity(nt);
    for &t in tokens {
        if t as usize >= embd.rows {
            return Err(Error::Reference(format!(
                "token {t} out of vocab {}",
                embd.rows
            )));
        }
        xs.push(embd.row(t as usize).to_vec());
    }
    for l in 0..hp.block_count {
        let w = |t: Layer| load(model, &t.name(l));
        let opt = |t: Layer, on: bool| if on { w(t).map(Some) } else { Ok(None) };
        let (wq, wk, wv, wo) = (
            w(Layer::AttnQ)?,
            w(Layer::AttnK)?,
            w(Layer::AttnV)?,
            w(Layer::AttnOutput)?,
        );
        let bias = hp.arch.has_qkv_bias();
        let (bq, bk, bv) = (
            opt(Layer::AttnQBias, bias)?,
            opt(Layer::AttnKBias, bias)?,
            opt(Layer::AttnVBias, bias)?,
        );
        let qkn = hp.arch.has_qk_norm();
        let (qn, kn) = (opt(Layer::AttnQNorm, qkn)?, opt(Layer::AttnKNorm, qkn)?);
        let (an, fnrm) = (w(Layer::AttnNorm)?, w(Layer::FfnNorm)?);
        let (wg, wu, wd) = (w(Layer::FfnGate)?, w(Layer::FfnUp)?, w(Layer::FfnDown)?);
        let mut ks = Vec::with_capacity(nt);
        let mut vs = Vec::with_capacity(nt);
        let mut qs = Vec::with_capacity(nt);
        for (p, x) in xs.iter().enumerate() {
            let h = rms_norm(x, &an.w, eps);
            let (mut q, mut k, mut v) = (wq.apply(&h), wk.apply(&h), wv.apply(&h));
            add_bias(&mut q, &bq);
            add_bias(&mut k, &bk);
            add_bias(&mut v, &bv);
            if let (Some(qn), Some(kn)) = (&qn, &kn) {
                q = q
                    .chunks_exact(hd)
                    .flat_map(|c| rms_norm(c, &qn.w, eps))
                    .collect();
                k = k
                    .chunks_exact(hd)
                    .flat_map(|c| rms_norm(c, &kn.w, eps))
                    .collect();
            }
            rope(&mut q, p, hd, style, base, scale);
            rope(&mut k, p, hd, style, base, scale);
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        for (p, x) in xs.iter_mut().enumerate() {
            let mut att = vec![0f64; nh * hd];
            for h in 0..nh {
                let kvh = h / (nh / nkv);
                let q = &qs[p][h * hd..(h + 1) * hd];
                let sc: Vec<f64> = (0..=p)
                    .map(|c| {
                        let k = &ks[c][kvh * hd..(kvh + 1) * hd];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (c, ec) in e.iter().enumerate() {
                    let v = &vs[c][kvh * hd..(kvh + 1) * hd];
                    for (o, vv) in att[h * hd..(h + 1) * hd].iter_mut().zip(v) {
                        *o += ec / z * vv;
                    }
                }
            }
            for (xv, ov) in x.iter_mut().zip(wo.apply(&att)) {
                *xv += ov;
            }
            let h = rms_norm(x, &fnrm.w, eps);
            let (g, u) = (wg.apply(&h), wu.apply(&h));
            let m: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            for (xv, dv) in x.iter_mut().zip(wd.apply(&m)) {
                *xv += dv;
            }
        }
    }
    let on = load(model, names::OUTPUT_NORM)?;
    let out = load(model, output_weight_name(model))?;
    Ok(xs
        .iter()
        .map(|x| out.apply(&rms_norm(x, &on.w, eps)))
        .collect())
}
