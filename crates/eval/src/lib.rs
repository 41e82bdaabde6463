//! minfer-eval: evaluation over the engine's public API (ADR 0012).
//!
//! Perplexity and KL divergence over a text, with llama-perplexity's method (its
//! `tools/perplexity/perplexity.cpp`), so the numbers compare with llama.cpp's.
//!
//! - The tokens (BOS first when the vocabulary adds one) are cut into `n_chunk` chunks of
//!   `n_ctx`; each chunk is evaluated from an empty KV cache, its first token replaced by BOS
//!   when the vocabulary adds one; only the second half is scored (positions
//!   `n_ctx/2 .. n_ctx-1` predict the next token), so every scored token has at least
//!   `n_ctx/2` tokens of context. PPL = exp(mean NLL) over all scored tokens; its error is
//!   `ppl * sqrt(var(nll) / (count - 1))`.
//! - [`logits_file`] reads and writes llama-perplexity's `--kl-divergence-base` file
//!   (the same bytes: a base file made by either tool is read by the other), and
//!   [`kl_divergence`] compares a model against one: mean KLD, top-token agreement, ΔPPL.
//!
//! The forward is the engine's own ([`Engine::decode`]); a chunk longer than `n_batch` runs
//! as several forwards, the KV cache carrying the chunk's earlier tokens, as llama.cpp does.

pub mod logits_file;
mod stats;

pub use logits_file::{BaseLogits, LogitsWriter};
pub use stats::{KldStats, KldSummary};

use minfer_engine::{Engine, Error, Result};

/// How to cut the text (llama-perplexity's `-c`, `-b`, `--chunks`).
#[derive(Clone, Debug)]
pub struct PplConfig {
    /// Tokens per chunk (llama-perplexity's `-c`, default 512).
    pub n_ctx: usize,
    /// Most tokens per forward (`-b`); chunks longer than this run as several forwards.
    pub n_batch: usize,
    /// At most this many chunks (None: as many as the text holds).
    pub n_chunks: Option<usize>,
    /// The BOS id when the vocabulary adds one (it replaces each chunk's first token).
    pub bos: Option<u32>,
}

/// The running estimate after one chunk.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkReport {
    /// 1-based chunk number and the total.
    pub chunk: usize,
    pub n_chunks: usize,
    /// exp(mean NLL) over every token scored so far.
    pub ppl: f64,
}

/// The final figures of a perplexity run.
#[derive(Clone, Debug, PartialEq)]
pub struct PplResult {
    pub ppl: f64,
    /// One standard error of `ppl`.
    pub ppl_err: f64,
    pub n_chunks: usize,
    /// Tokens scored (`n_chunks * (n_ctx - n_ctx/2 - 1)`).
    pub count: usize,
}

/// Checks the cut and returns (n_chunk, first scored position).
fn plan(cfg: &PplConfig, n_tokens: usize, engine: &Engine) -> Result<(usize, usize)> {
    let bad = |m: String| Err(Error::BadRequest(m));
    if cfg.n_ctx < 4 {
        return bad(format!(
            "perplexity: a chunk of {} tokens is too short",
            cfg.n_ctx
        ));
    }
    if n_tokens < 2 * cfg.n_ctx {
        return bad(format!(
            "perplexity: the text has {n_tokens} tokens; a context of {} needs at least {}",
            cfg.n_ctx,
            2 * cfg.n_ctx
        ));
    }
    if cfg.n_ctx > engine.n_ctx() {
        return bad(format!(
            "perplexity: chunks of {} tokens exceed the engine's context of {}",
            cfg.n_ctx,
            engine.n_ctx()
        ));
    }
    if cfg.n_batch == 0 {
        return bad("perplexity: the batch size must be at least 1".into());
    }
    let max = n_tokens / cfg.n_ctx;
    Ok((cfg.n_chunks.map_or(max, |n| n.min(max)), cfg.n_ctx / 2))
}

/// The logits of positions `first..n_ctx` of one chunk (row-major, `vocab` each), from an
/// empty cache, in forwards of at most `n_batch` tokens (and of the engine's n_batch: the
/// engine is batch invariant, so the split does not change the logits).
fn chunk_logits(
    engine: &mut Engine,
    chunk: &[u32],
    first: usize,
    n_batch: usize,
) -> Result<Vec<f32>> {
    let vocab = engine.hparams().vocab_size;
    let n_batch = n_batch.min(engine.n_batch());
    let mut rows = Vec::with_capacity((chunk.len() - first) * vocab);
    let mut start = 0;
    while start < chunk.len() {
        let end = (start + n_batch).min(chunk.len());
        // Rows at positions >= first need logits; they are a suffix of this forward.
        let want = end - start.max(first).min(end);
        // pos0 = 0 on the first forward drops the previous chunk's cells.
        let out = engine.decode(&chunk[start..end], start, want.max(1))?;
        if want > 0 {
            rows.extend_from_slice(&out[out.len() - want * vocab..]);
        }
        start = end;
    }
    Ok(rows)
}

/// Chunk `i`'s tokens with BOS in front when the vocabulary adds one.
fn chunk_tokens(tokens: &[u32], i: usize, n_ctx: usize, bos: Option<u32>) -> Vec<u32> {
    let mut c = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
    if let Some(b) = bos {
        c[0] = b;
    }
    c
}

/// -log p(tok) from one row of logits: the max in f32, the sum of `exp(l - max)` (f32 exps)
/// in f64, as llama-perplexity computes it.
pub fn nll(row: &[f32], tok: u32) -> f64 {
    let max = row.iter().fold(row[0], |m, &v| m.max(v));
    let sum: f64 = row.iter().map(|&v| (v - max).exp() as f64).sum();
    -((row[tok as usize] - max) as f64 - sum.ln())
}

/// Perplexity of `tokens` (already tokenized with BOS when the vocabulary adds one);
/// `save` writes the `--kl-divergence-base` file as it goes.
///
/// # Errors
/// A text shorter than two chunks, chunks longer than the engine's context, and forward
/// failures.
pub fn perplexity(
    engine: &mut Engine,
    tokens: &[u32],
    cfg: &PplConfig,
    mut save: Option<&mut LogitsWriter>,
    on_chunk: &mut dyn FnMut(ChunkReport),
) -> Result<PplResult> {
    let (n_chunk, first) = plan(cfg, tokens.len(), engine)?;
    let vocab = engine.hparams().vocab_size;
    let n_batch = cfg.n_batch.min(cfg.n_ctx);
    if let Some(w) = save.as_deref_mut() {
        w.begin(cfg.n_ctx, vocab, n_chunk, &tokens[..n_chunk * cfg.n_ctx])?;
    }
    let (mut sum, mut sum2, mut count) = (0.0f64, 0.0f64, 0usize);
    for i in 0..n_chunk {
        let chunk = chunk_tokens(tokens, i, cfg.n_ctx, cfg.bos);
        let rows = chunk_logits(engine, &chunk, first, n_batch)?;
        // Scored: positions first..n_ctx-1 predicting the (original) next token.
        let next = &tokens[i * cfg.n_ctx + first + 1..(i + 1) * cfg.n_ctx];
        for (row, &tok) in rows.chunks_exact(vocab).zip(next) {
            let v = match save.as_deref_mut() {
                Some(w) => w.push_row(row, tok)?,
                None => nll(row, tok),
            };
            sum += v;
            sum2 += v * v;
            count += 1;
        }
        on_chunk(ChunkReport {
            chunk: i + 1,
            n_chunks: n_chunk,
            ppl: (sum / count as f64).exp(),
        });
    }
    if let Some(w) = save {
        w.finish()?;
    }
    let mean = sum / count as f64;
    let ppl = mean.exp();
    let var = sum2 / count as f64 - mean * mean;
    let ppl_err = if var > 0.0 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    Ok(PplResult {
        ppl,
        ppl_err,
        n_chunks: n_chunk,
        count,
    })
}

/// Compares the engine's model with a base file's log-probabilities, chunk by chunk, on the
/// tokens stored in the file; `on_chunk` gets the running statistics.
///
/// # Errors
/// A vocabulary or context that does not fit the file, a truncated file, forward failures.
pub fn kl_divergence(
    engine: &mut Engine,
    base: &mut BaseLogits,
    n_batch: usize,
    bos: Option<u32>,
    on_chunk: &mut dyn FnMut(usize, &KldStats),
) -> Result<KldSummary> {
    let vocab = engine.hparams().vocab_size;
    let (n_ctx, n_chunk) = (base.n_ctx(), base.n_chunk());
    if base.n_vocab() != vocab {
        return Err(Error::BadRequest(format!(
            "kl-divergence: the base file has a vocabulary of {}, the model {vocab}",
            base.n_vocab()
        )));
    }
    let cfg = PplConfig {
        n_ctx,
        n_batch,
        n_chunks: Some(n_chunk),
        bos,
    };
    // The file holds exactly n_chunk chunks, so only the context and batch checks apply.
    plan(&cfg, 2 * n_ctx, engine)?;
    let first = n_ctx / 2;
    let tokens = base.tokens().to_vec();
    let mut stats = KldStats::default();
    for i in 0..n_chunk {
        let chunk = chunk_tokens(&tokens, i, n_ctx, bos);
        let rows = chunk_logits(engine, &chunk, first, n_batch.min(n_ctx))?;
        let next = &tokens[i * n_ctx + first + 1..(i + 1) * n_ctx];
        let base_rows = base.read_chunk()?;
        for ((row, &tok), b) in rows.chunks_exact(vocab).zip(next).zip(base_rows) {
            stats.add(row, b, tok);
        }
        on_chunk(i + 1, &stats);
    }
    Ok(stats.summary())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Uniform logits over 4 tokens: -log p = ln 4 for every token.
    #[test]
    fn nll_of_uniform_logits_is_ln_vocab() {
        assert!((nll(&[2.0; 4], 1) - 4f64.ln()).abs() < 1e-12);
        // p = e^1 / (e^1 + 3) for the larger logit.
        let want = -(1f64.exp() / (1f64.exp() + 3.0)).ln();
        assert!((nll(&[1.0, 0.0, 0.0, 0.0], 0) - want).abs() < 1e-6);
    }
}
