//! llama-perplexity's log-probability file (`--kl-divergence-base`), byte for byte, so a
//! base made by llama.cpp is read here and one made here is read by llama.cpp.
//!
//! Layout (little-endian): `_logits_`, n_ctx i32, n_vocab i32, n_chunk i32, the
//! n_chunk * n_ctx evaluated tokens (i32), then for each chunk its n_ctx - 1 - n_ctx/2 scored
//! rows of `nv = 2 * ceil(n_vocab / 2) + 4` u16: a row starts with two f32, `scale` and
//! `min_log_prob`, then each token's log-probability quantized to 16 bits as
//! `round((logit - min_logit) / scale)`, where `min_logit` is the row's smallest logit but at
//! most 16 below its largest (rarer tokens read as probability ~0), then zero padding.

use minfer_engine::{Error, Result};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"_logits_";

/// u16 slots per row for a vocabulary.
pub fn row_slots(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

fn io_err(path: &Path, e: std::io::Error) -> Error {
    Error::BadRequest(format!("{}: {e}", path.display()))
}

/// ggml's round-half-even by the 1.5 * 2^23 trick (llama-perplexity's `nearest_int`).
fn nearest_int(v: f32) -> i32 {
    ((v + 12_582_912.0f32).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Writes a base file while perplexity runs.
pub struct LogitsWriter {
    path: PathBuf,
    out: BufWriter<std::fs::File>,
    row: Vec<u16>,
}

impl LogitsWriter {
    pub fn create(path: &Path) -> Result<Self> {
        let f = std::fs::File::create(path).map_err(|e| io_err(path, e))?;
        Ok(LogitsWriter {
            path: path.into(),
            out: BufWriter::with_capacity(1 << 20, f),
            row: Vec::new(),
        })
    }

    fn write(&mut self, b: &[u8]) -> Result<()> {
        self.out.write_all(b).map_err(|e| io_err(&self.path, e))
    }

    /// The header and the tokens that will be evaluated.
    pub(crate) fn begin(
        &mut self,
        n_ctx: usize,
        n_vocab: usize,
        n_chunk: usize,
        tokens: &[u32],
    ) -> Result<()> {
        self.write(MAGIC)?;
        for v in [n_ctx, n_vocab, n_chunk] {
            self.write(&(v as i32).to_le_bytes())?;
        }
        let bytes: Vec<u8> = tokens
            .iter()
            .flat_map(|&t| (t as i32).to_le_bytes())
            .collect();
        self.write(&bytes)?;
        self.row = vec![0u16; row_slots(n_vocab)];
        Ok(())
    }

    /// Quantizes and writes one row; returns -log p(tok) as llama-perplexity computes it
    /// while saving (`max + log_sum_exp - logit[tok]` in f32).
    pub(crate) fn push_row(&mut self, logits: &[f32], tok: u32) -> Result<f64> {
        let (mut max, mut min) = (logits[0], logits[0]);
        for &v in &logits[1..] {
            max = max.max(v);
            min = min.min(v);
        }
        min = min.max(max - 16.0);
        let sum: f64 = logits.iter().map(|&v| (v - max).exp() as f64).sum();
        let log_sum_exp = sum.ln() as f32;
        let min_log_prob = min - max - log_sum_exp;
        let scale = (max - min) / 65535.0;
        let row = &mut self.row;
        row.fill(0);
        row[0..2].copy_from_slice(&[scale.to_bits() as u16, (scale.to_bits() >> 16) as u16]);
        let m = min_log_prob.to_bits();
        row[2..4].copy_from_slice(&[m as u16, (m >> 16) as u16]);
        if scale != 0.0 {
            let inv = 1.0 / scale;
            for (q, &v) in row[4..4 + logits.len()].iter_mut().zip(logits) {
                *q = if v > min {
                    nearest_int(inv * (v - min)) as u16
                } else {
                    0
                };
            }
        }
        let bytes: Vec<u8> = self.row.iter().flat_map(|q| q.to_le_bytes()).collect();
        self.write(&bytes)?;
        Ok((max + log_sum_exp - logits[tok as usize]) as f64)
    }

    pub(crate) fn finish(&mut self) -> Result<()> {
        self.out.flush().map_err(|e| io_err(&self.path, e))
    }
}

/// A base file open for comparison: header and tokens read, rows read chunk by chunk.
pub struct BaseLogits {
    path: PathBuf,
    input: BufReader<std::fs::File>,
    n_ctx: usize,
    n_vocab: usize,
    n_chunk: usize,
    tokens: Vec<u32>,
    buf: Vec<u16>,
}

impl BaseLogits {
    /// Opens `path` and reads its header and tokens.
    ///
    /// # Errors
    /// Not a log-probability file, a bad header, a truncated token list.
    pub fn open(path: &Path) -> Result<Self> {
        let f = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
        let mut input = BufReader::with_capacity(1 << 20, f);
        let bad = |m: &str| Error::BadRequest(format!("{}: {m}", path.display()));
        let mut magic = [0u8; 8];
        input
            .read_exact(&mut magic)
            .map_err(|_| bad("too short for a log-probability file"))?;
        if &magic != MAGIC {
            return Err(bad("not a log-probability file (no _logits_ magic)"));
        }
        let mut head = [0u8; 12];
        input
            .read_exact(&mut head)
            .map_err(|_| bad("truncated header"))?;
        let field = |i: usize| i32::from_le_bytes(head[4 * i..4 * i + 4].try_into().unwrap());
        let (n_ctx, n_vocab, n_chunk) = (field(0), field(1), field(2));
        if n_ctx < 4 || n_vocab < 1 || n_chunk < 1 {
            return Err(bad(&format!(
                "bad header: n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk}"
            )));
        }
        let (n_ctx, n_vocab, n_chunk) = (n_ctx as usize, n_vocab as usize, n_chunk as usize);
        let n_tok = n_ctx
            .checked_mul(n_chunk)
            .filter(|&n| n <= 1 << 30)
            .ok_or_else(|| bad("token count overflows"))?;
        let mut raw = vec![0u8; n_tok * 4];
        input
            .read_exact(&mut raw)
            .map_err(|_| bad("truncated token list"))?;
        let tokens: Vec<u32> = raw
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect();
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(bad(&format!(
                "token {t} outside the vocabulary of {n_vocab}"
            )));
        }
        Ok(BaseLogits {
            path: path.into(),
            input,
            n_ctx,
            n_vocab,
            n_chunk,
            tokens,
            buf: Vec::new(),
        })
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }
    pub fn n_chunk(&self) -> usize {
        self.n_chunk
    }
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The next chunk's rows, `row_slots(n_vocab)` u16 each.
    pub(crate) fn read_chunk(&mut self) -> Result<std::slice::ChunksExact<'_, u16>> {
        let nv = row_slots(self.n_vocab);
        let rows = self.n_ctx - 1 - self.n_ctx / 2;
        let mut raw = vec![0u8; rows * nv * 2];
        self.input.read_exact(&mut raw).map_err(|_| {
            Error::BadRequest(format!(
                "{}: truncated log-probabilities",
                self.path.display()
            ))
        })?;
        self.buf.clear();
        self.buf.extend(
            raw.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]])),
        );
        Ok(self.buf.chunks_exact(nv))
    }
}

/// The (scale, min_log_prob) header of a base row.
pub(crate) fn row_header(row: &[u16]) -> (f32, f32) {
    let f = |i: usize| f32::from_bits(row[i] as u32 | (row[i + 1] as u32) << 16);
    (f(0), f(2))
}
