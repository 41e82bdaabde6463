//! The CPU tensor-parallel forward (issue 36, ADR 0015): one [`TpRank`] per rank thread, each
//! holding its shard of every weight ([`crate::shard`]) and its KV heads' cache, talking to
//! the others only through a [`Communicator`]. It proves the sharding plan and the
//! communicator on the CPU; the CUDA ranks (a thread, a stream and an NCCL communicator per
//! GPU) follow the same step and are blocked on a multi-GPU machine.
//!
//! Plain f32 arithmetic, one token per step with a KV cache, no graph: it is the shard-wise
//! twin of [`crate::reference`] (which is f64 and whole-model), and at N = 1 it is the
//! unsharded f32 forward the N > 1 runs are measured against.

use crate::arch::{names, names::Layer, HParams};
use crate::error::{Error, Result};
use crate::shard::{Cut, RankShard, TpPlan};
use crate::tensors::output_weight_name;
use minfer_gguf::{quants, GgufModel};
use minfer_graph::{Communicator, RopeStyle};

/// A rank's piece of one weight, f32, `rows` rows of `cols`.
struct Mat {
    rows: usize,
    cols: usize,
    w: Vec<f32>,
}

impl Mat {
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        self.w
            .chunks_exact(self.cols)
            .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    }
}

/// Loads `name` (whole, dequantized) and keeps the rank's cut. 1-D tensors cut by rows keep
/// those elements.
fn load(model: &GgufModel, name: &str, cut: &Cut) -> Result<Mat> {
    let (info, bytes) = model.tensor_data(name)?;
    let cols = info.dims[0] as usize;
    let rows = (info.n_elements() / info.dims[0]) as usize;
    let mut f = vec![0f32; cols * rows];
    quants::dequantize_row(info.ty, bytes, &mut f)?;
    let bad = |what: String| Error::Unsupported {
        name: name.into(),
        problem: what,
    };
    Ok(match cut {
        Cut::Replicated => Mat { rows, cols, w: f },
        Cut::Rows(r) if rows == 1 => {
            let w = f
                .get(r.clone())
                .ok_or_else(|| bad(format!("no elements {r:?}")))?;
            Mat {
                rows: 1,
                cols: r.len(),
                w: w.to_vec(),
            }
        }
        Cut::Rows(r) => {
            let w = f
                .get(r.start * cols..r.end * cols)
                .ok_or_else(|| bad(format!("no rows {r:?}")))?;
            Mat {
                rows: r.len(),
                cols,
                w: w.to_vec(),
            }
        }
        Cut::Cols(c) => {
            if c.end > cols {
                return Err(bad(format!("no columns {c:?} in rows of {cols}")));
            }
            let w = f
                .chunks_exact(cols)
                .flat_map(|row| &row[c.clone()])
                .copied();
            Mat {
                rows,
                cols: c.len(),
                w: w.collect(),
            }
        }
    })
}

/// Planted faults: the controls that must break the gates, and the failing rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TpFault {
    /// Skip the all-reduce after the attention output (each rank keeps its partial sum).
    SkipAttnAllReduce,
    /// Load `ffn_down`'s columns one FFN column to the right of the rank's own (wrapping):
    /// a wrong shard offset.
    ShiftFfnDown,
    /// Return an error (and abort the group) at this layer of the first step.
    FailAtLayer(usize),
}

struct LayerW {
    attn_norm: Mat,
    q: Mat,
    k: Mat,
    v: Mat,
    bias: Option<(Mat, Mat, Mat)>,
    qk_norm: Option<(Mat, Mat)>,
    o: Mat,
    ffn_norm: Mat,
    gate: Mat,
    up: Mat,
    down: Mat,
    /// Cached K and V rows of the rank's KV heads, one entry per position.
    kc: Vec<Vec<f32>>,
    vc: Vec<Vec<f32>>,
}

/// One rank of a tensor-parallel forward.
pub struct TpRank<C: Communicator> {
    comm: C,
    hp: HParams,
    shard: RankShard,
    vocab_per_rank: usize,
    embd: Mat,
    out_norm: Mat,
    out: Mat,
    layers: Vec<LayerW>,
    pos: usize,
    fault: Option<TpFault>,
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, g)| v * s * g).collect()
}

fn rope(x: &mut [f32], pos: usize, hd: usize, style: RopeStyle, base: f64, scale: f64) {
    for head in x.chunks_exact_mut(hd) {
        for j in 0..hd / 2 {
            let theta = scale * pos as f64 * base.powf(-2.0 * j as f64 / hd as f64);
            let (c, s) = (theta.cos() as f32, theta.sin() as f32);
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

fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

impl<C: Communicator> TpRank<C> {
    /// Rank `comm.rank()`'s shard of `model` under `plan`.
    pub fn load(
        model: &GgufModel,
        hp: &HParams,
        plan: &TpPlan,
        comm: C,
        fault: Option<TpFault>,
    ) -> Result<TpRank<C>> {
        let r = comm.rank();
        if comm.size() != plan.n {
            return Err(Error::Reference(format!(
                "a plan for {} ranks on a group of {}",
                plan.n,
                comm.size()
            )));
        }
        let shard = plan.ranks[r].clone();
        let mut layers = Vec::with_capacity(hp.block_count);
        for l in 0..hp.block_count {
            let w = |t: Layer| load(model, &t.name(l), &plan.layer_cut(r, t));
            let mut down_cut = plan.layer_cut(r, Layer::FfnDown);
            if fault == Some(TpFault::ShiftFfnDown) {
                if let Cut::Cols(c) = &down_cut {
                    let ff = hp.feed_forward_length;
                    let s = (c.start + 1) % (ff - c.len() + 1);
                    down_cut = Cut::Cols(s..s + c.len());
                }
            }
            layers.push(LayerW {
                attn_norm: w(Layer::AttnNorm)?,
                q: w(Layer::AttnQ)?,
                k: w(Layer::AttnK)?,
                v: w(Layer::AttnV)?,
                bias: if hp.arch.has_qkv_bias() {
                    Some((
                        w(Layer::AttnQBias)?,
                        w(Layer::AttnKBias)?,
                        w(Layer::AttnVBias)?,
                    ))
                } else {
                    None
                },
                qk_norm: if hp.arch.has_qk_norm() {
                    Some((w(Layer::AttnQNorm)?, w(Layer::AttnKNorm)?))
                } else {
                    None
                },
                o: w(Layer::AttnOutput)?,
                ffn_norm: w(Layer::FfnNorm)?,
                gate: w(Layer::FfnGate)?,
                up: w(Layer::FfnUp)?,
                down: load(model, &Layer::FfnDown.name(l), &down_cut)?,
                kc: Vec::new(),
                vc: Vec::new(),
            });
        }
        let vcut = plan.vocab_cut(r);
        Ok(TpRank {
            embd: load(model, names::TOKEN_EMBD, &vcut)?,
            out_norm: load(model, names::OUTPUT_NORM, &Cut::Replicated)?,
            out: load(model, output_weight_name(model), &vcut)?,
            comm,
            hp: hp.clone(),
            shard,
            vocab_per_rank: plan.vocab_per_rank,
            layers,
            pos: 0,
            fault,
        })
    }

    /// The all-reduce, or on error the group aborted so that no other rank waits for this one.
    fn reduce(&self, buf: &mut [f32]) -> Result<()> {
        self.comm
            .all_reduce_sum(buf)
            .map_err(|e| Error::Reference(e.to_string()))
    }

    fn fail(&self, why: String) -> Error {
        self.comm.abort(&why);
        Error::Reference(why)
    }

    /// One token at the next position: the whole vocabulary's logits (the same on every rank).
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>> {
        let hp = &self.hp;
        let (hd, d, eps) = (hp.head_dim, hp.embedding_length, hp.rms_epsilon);
        let style = hp.arch.rope_style();
        let (base, scale) = (hp.rope_freq_base as f64, 1.0 / hp.rope_scale as f64);
        let group = hp.head_count / hp.head_count_kv;
        let t = token as usize;
        if t >= hp.vocab_size {
            return Err(self.fail(format!("token {t} out of vocab {}", hp.vocab_size)));
        }
        // Vocabulary-parallel embedding: the owner's row, zeros elsewhere, summed (exact).
        let mut x = vec![0f32; d];
        if self.shard.vocab.contains(&t) {
            let i = t - self.shard.vocab.start;
            x.copy_from_slice(&self.embd.w[i * d..(i + 1) * d]);
        }
        self.reduce(&mut x)?;
        let p = self.pos;
        for l in 0..self.layers.len() {
            if self.fault == Some(TpFault::FailAtLayer(l)) {
                return Err(self.fail(format!("planted failure at layer {l}")));
            }
            let lw = &mut self.layers[l];
            let h = rms_norm(&x, &lw.attn_norm.w, eps);
            let (mut q, mut k, mut v) = (lw.q.apply(&h), lw.k.apply(&h), lw.v.apply(&h));
            if let Some((bq, bk, bv)) = &lw.bias {
                add(&mut q, &bq.w);
                add(&mut k, &bk.w);
                add(&mut v, &bv.w);
            }
            if let Some((qn, kn)) = &lw.qk_norm {
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
            lw.kc.push(k);
            lw.vc.push(v);
            // The rank's query heads against its own KV heads: no communication.
            let mut att = vec![0f32; q.len()];
            for (qh, (qv, o)) in q.chunks_exact(hd).zip(att.chunks_exact_mut(hd)).enumerate() {
                let kvh = qh / group;
                let kv = kvh * hd..(kvh + 1) * hd;
                let sc: Vec<f32> = lw
                    .kc
                    .iter()
                    .map(|kr| {
                        let dot: f32 = qv.iter().zip(&kr[kv.clone()]).map(|(a, b)| a * b).sum();
                        dot / (hd as f32).sqrt()
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for (ec, vr) in e.iter().zip(&lw.vc) {
                    for (ov, vv) in o.iter_mut().zip(&vr[kv.clone()]) {
                        *ov += ec / z * vv;
                    }
                }
            }
            // Row-parallel output projection: partial sums, one all-reduce.
            let mut o = lw.o.apply(&att);
            let skip = self.fault == Some(TpFault::SkipAttnAllReduce);
            if !skip {
                self.reduce(&mut o)?;
            }
            add(&mut x, &o);
            let lw = &self.layers[l];
            let h = rms_norm(&x, &lw.ffn_norm.w, eps);
            let (g, u) = (lw.gate.apply(&h), lw.up.apply(&h));
            let m: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let mut dn = lw.down.apply(&m);
            self.reduce(&mut dn)?;
            add(&mut x, &dn);
        }
        self.pos += 1;
        // Vocabulary-parallel head: the rank's logits, padded to equal pieces, gathered.
        let h = rms_norm(&x, &self.out_norm.w, eps);
        let mut mine = self.out.apply(&h);
        mine.resize(self.vocab_per_rank, 0.0);
        let mut all = vec![0f32; self.vocab_per_rank * self.comm.size()];
        self.comm
            .all_gather(&mine, &mut all)
            .map_err(|e| Error::Reference(e.to_string()))?;
        all.truncate(self.hp.vocab_size);
        debug_assert_eq!(self.out.rows, self.shard.vocab.len());
        Ok(all)
    }
}
