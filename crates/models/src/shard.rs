//! The tensor-parallel sharding plan (issue 36, ADR 0015): which rows and columns of each
//! weight, and which heads, rank r of N holds. A pure function of the hyperparameters and N.
//!
//! Megatron's split, for Qwen2 / Qwen3 / LLaMA:
//! - Q, K, V (and their Qwen2 biases) column-parallel: a rank holds the output rows of its
//!   heads. KV heads are split evenly and each rank takes the query heads of its KV heads'
//!   groups, so attention needs no communication. N must divide `head_count_kv`: KV heads
//!   are not replicated (refused by name otherwise).
//! - `attn_output` row-parallel: a rank holds the input columns of its query heads; the
//!   ranks' partial outputs are added by one all-reduce.
//! - gate and up column-parallel (rows of the FFN width), `ffn_down` row-parallel (the same
//!   columns), one all-reduce after it. N must divide `feed_forward_length`.
//! - `token_embd` and the output head split by vocabulary rows into N equal pieces of
//!   ceil(V / N) (the last one short, or empty): the embedding lookup is an all-reduce of the
//!   owning rank's row and the others' zeros, the logits an all-gather of equal pieces (NCCL
//!   gathers equal counts; the padding past V is dropped).
//! - Norms (and Qwen3's per-head Q/K norms) replicated.
//!
//! GGUF matrices are stored row-major with `dims[0]` the row length (input width): a
//! column-parallel weight's shard is a range of whole rows; a row-parallel weight's shard is a
//! range of every row's columns, which for a block-quantized type must start and end on a
//! block ([`TpPlan::check_block_len`]).

use crate::arch::{names::Layer, HParams};
use std::ops::Range;

/// Why a model cannot be split N ways. Each names what does not divide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("tensor parallelism needs N >= 1 ranks, got 0")]
    Zero,
    #[error("--tensor-parallel {n}: {what} {value} is not a multiple of {n} (KV heads are not replicated across ranks)")]
    NotDivisible {
        n: usize,
        what: &'static str,
        value: usize,
    },
    #[error("--tensor-parallel {n}: {tensor}'s shard of {cols} columns from column {start} does not fall on its {block}-element quantization blocks")]
    Blocks {
        n: usize,
        tensor: String,
        start: usize,
        cols: usize,
        block: usize,
    },
}

/// How a weight is cut for one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Whole rows `rows` (column-parallel: the rank's outputs).
    Rows(Range<usize>),
    /// Columns `cols` of every row (row-parallel: the rank's inputs).
    Cols(Range<usize>),
    /// The whole tensor on every rank.
    Replicated,
}

/// One rank's part of the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankShard {
    pub rank: usize,
    /// Query heads `q_heads` (contiguous, the groups of `kv_heads`).
    pub q_heads: Range<usize>,
    pub kv_heads: Range<usize>,
    /// FFN columns (rows of gate/up, columns of down).
    pub ffn: Range<usize>,
    /// Vocabulary rows this rank owns (within 0..V; may be empty).
    pub vocab: Range<usize>,
}

/// The whole plan: N ranks' shards and the shared sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpPlan {
    pub n: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    /// Every rank's logits piece is this long (the last ones padded past V).
    pub vocab_per_rank: usize,
    pub ranks: Vec<RankShard>,
}

fn split(total: usize, n: usize, r: usize) -> Range<usize> {
    let per = total / n;
    r * per..(r + 1) * per
}

impl TpPlan {
    /// The plan for `n` ranks, or the hyperparameter that `n` does not divide.
    pub fn new(hp: &HParams, n: usize) -> Result<TpPlan, ShardError> {
        if n == 0 {
            return Err(ShardError::Zero);
        }
        let need = |what, value: usize| {
            if value.is_multiple_of(n) {
                Ok(())
            } else {
                Err(ShardError::NotDivisible { n, what, value })
            }
        };
        need("attention.head_count_kv", hp.head_count_kv)?;
        need("feed_forward_length", hp.feed_forward_length)?;
        let group = hp.head_count / hp.head_count_kv;
        let vocab_per_rank = hp.vocab_size.div_ceil(n);
        let ranks = (0..n)
            .map(|r| {
                let kv = split(hp.head_count_kv, n, r);
                RankShard {
                    rank: r,
                    q_heads: kv.start * group..kv.end * group,
                    kv_heads: kv,
                    ffn: split(hp.feed_forward_length, n, r),
                    vocab: (r * vocab_per_rank).min(hp.vocab_size)
                        ..((r + 1) * vocab_per_rank).min(hp.vocab_size),
                }
            })
            .collect();
        Ok(TpPlan {
            n,
            head_dim: hp.head_dim,
            vocab_size: hp.vocab_size,
            vocab_per_rank,
            ranks,
        })
    }

    /// How rank `r` cuts the layer tensor `t`.
    pub fn layer_cut(&self, r: usize, t: Layer) -> Cut {
        let s = &self.ranks[r];
        let hd = self.head_dim;
        let heads = |h: &Range<usize>| h.start * hd..h.end * hd;
        match t {
            Layer::AttnQ | Layer::AttnQBias => Cut::Rows(heads(&s.q_heads)),
            Layer::AttnK | Layer::AttnV | Layer::AttnKBias | Layer::AttnVBias => {
                Cut::Rows(heads(&s.kv_heads))
            }
            Layer::AttnOutput => Cut::Cols(heads(&s.q_heads)),
            Layer::FfnGate | Layer::FfnUp => Cut::Rows(s.ffn.clone()),
            Layer::FfnDown => Cut::Cols(s.ffn.clone()),
            Layer::AttnNorm | Layer::FfnNorm | Layer::AttnQNorm | Layer::AttnKNorm => {
                Cut::Replicated
            }
        }
    }

    /// `token_embd` and the output head: rows of the rank's vocabulary.
    pub fn vocab_cut(&self, r: usize) -> Cut {
        Cut::Rows(self.ranks[r].vocab.clone())
    }

    /// Refuses a row-parallel shard whose columns cut through `block`-element quantization
    /// blocks of `tensor` (block 1: any float type).
    pub fn check_block_len(&self, tensor: &str, t: Layer, block: usize) -> Result<(), ShardError> {
        for r in 0..self.n {
            if let Cut::Cols(c) = self.layer_cut(r, t) {
                if !c.start.is_multiple_of(block) || !c.len().is_multiple_of(block) {
                    return Err(ShardError::Blocks {
                        n: self.n,
                        tensor: tensor.into(),
                        start: c.start,
                        cols: c.len(),
                        block,
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Arch;

    fn hp(nh: usize, nkv: usize, hd: usize, ff: usize, vocab: usize) -> HParams {
        HParams {
            arch: Arch::Qwen2,
            block_count: 2,
            embedding_length: nh * hd,
            feed_forward_length: ff,
            head_count: nh,
            head_count_kv: nkv,
            head_dim: hd,
            context_length: 4096,
            rms_epsilon: 1e-6,
            rope_freq_base: 1e6,
            rope_scale: 1.0,
            vocab_size: vocab,
        }
    }

    const ALL: [Layer; 14] = [
        Layer::AttnNorm,
        Layer::AttnQ,
        Layer::AttnK,
        Layer::AttnV,
        Layer::AttnQBias,
        Layer::AttnKBias,
        Layer::AttnVBias,
        Layer::AttnQNorm,
        Layer::AttnKNorm,
        Layer::AttnOutput,
        Layer::FfnNorm,
        Layer::FfnGate,
        Layer::FfnUp,
        Layer::FfnDown,
    ];

    /// Every index of 0..total owned by exactly one rank, the pieces' sizes adding up.
    fn exactly_once(pieces: &[Range<usize>], total: usize) -> Result<(), String> {
        let mut owner = vec![0usize; total];
        for p in pieces {
            if p.end > total {
                return Err(format!("{p:?} past {total}"));
            }
            p.clone().for_each(|i| owner[i] += 1);
        }
        match owner.iter().position(|&c| c != 1) {
            Some(i) => Err(format!("index {i} owned {} times", owner[i])),
            None => Ok(()),
        }
    }

    /// The property for every weight: the rows (or columns) the ranks cut are a partition.
    fn check_partition(h: &HParams, n: usize) {
        let p = TpPlan::new(h, n).unwrap();
        let (hd, ff) = (h.head_dim, h.feed_forward_length);
        for t in ALL {
            let cuts: Vec<Cut> = (0..n).map(|r| p.layer_cut(r, t)).collect();
            let total = match t {
                Layer::AttnQ | Layer::AttnQBias | Layer::AttnOutput => h.head_count * hd,
                Layer::AttnK | Layer::AttnV | Layer::AttnKBias | Layer::AttnVBias => {
                    h.head_count_kv * hd
                }
                Layer::FfnGate | Layer::FfnUp | Layer::FfnDown => ff,
                _ => {
                    assert!(cuts.iter().all(|c| *c == Cut::Replicated), "{t:?}");
                    continue;
                }
            };
            let ranges: Vec<Range<usize>> = cuts
                .into_iter()
                .map(|c| match c {
                    Cut::Rows(r) | Cut::Cols(r) => r,
                    Cut::Replicated => panic!("{t:?} replicated"),
                })
                .collect();
            exactly_once(&ranges, total).unwrap_or_else(|e| panic!("{t:?} N={n}: {e}"));
        }
        let vocab: Vec<_> = (0..n)
            .map(|r| match p.vocab_cut(r) {
                Cut::Rows(r) => r,
                _ => unreachable!(),
            })
            .collect();
        exactly_once(&vocab, h.vocab_size).unwrap();
        assert!(p.vocab_per_rank * n >= h.vocab_size);
        for s in &p.ranks {
            assert!(s.vocab.len() <= p.vocab_per_rank);
            // A rank's query heads are exactly its KV heads' groups.
            let g = h.head_count / h.head_count_kv;
            for q in s.q_heads.clone() {
                assert!(s.kv_heads.contains(&(q / g)), "q head {q} off its kv head");
            }
        }
    }

    #[test]
    fn every_weight_row_and_column_is_owned_exactly_once() {
        // Qwen2.5-7B, LLaMA-70B-like, a tiny one with a vocabulary not divisible by N.
        for (h, ns) in [
            (hp(28, 4, 128, 18944, 152064), vec![1, 2, 4]),
            (hp(64, 8, 128, 28672, 128256), vec![1, 2, 4, 8]),
            (hp(8, 4, 8, 96, 1001), vec![1, 2, 4]),
        ] {
            for n in ns {
                check_partition(&h, n);
            }
        }
    }

    #[test]
    fn the_partition_check_sees_an_overlap() {
        // Control: a plan with rank 1's FFN range shifted by one is caught.
        assert!(exactly_once(&[0..4, 3..8], 8).is_err());
        assert!(exactly_once(&[0..4, 5..8], 8).is_err());
        assert!(exactly_once(&[0..4, 4..8], 8).is_ok());
    }

    #[test]
    fn n_not_dividing_kv_heads_or_ffn_is_refused_by_name() {
        // Qwen2.5-0.5B: 2 KV heads.
        let e = TpPlan::new(&hp(14, 2, 64, 4864, 151936), 4).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--tensor-parallel 4: attention.head_count_kv 2 is not a multiple of 4 (KV heads are not replicated across ranks)"
        );
        let e = TpPlan::new(&hp(8, 8, 8, 100, 64), 8).unwrap_err();
        assert!(matches!(
            e,
            ShardError::NotDivisible {
                what: "feed_forward_length",
                ..
            }
        ));
        assert_eq!(
            TpPlan::new(&hp(8, 8, 8, 96, 64), 0).unwrap_err(),
            ShardError::Zero
        );
    }

    #[test]
    fn row_parallel_columns_must_fall_on_quant_blocks() {
        let p = TpPlan::new(&hp(8, 4, 64, 768, 64), 4).unwrap();
        // ffn 768 / 4 = 192 columns: Q8_0's 32 fits, Q4_K's 256 does not.
        assert!(p
            .check_block_len("blk.0.ffn_down.weight", Layer::FfnDown, 32)
            .is_ok());
        let e = p
            .check_block_len("blk.0.ffn_down.weight", Layer::FfnDown, 256)
            .unwrap_err();
        assert!(e.to_string().contains("blk.0.ffn_down.weight"), "{e}");
        // Column-parallel weights are cut by whole rows: no block constraint.
        assert!(p
            .check_block_len("blk.0.ffn_up.weight", Layer::FfnUp, 256)
            .is_ok());
    }
}
