//! `minfer perplexity -m MODEL -f TEXT`: llama-perplexity's perplexity and KL divergence
//! over `minfer_eval`; the running estimate on stdout, timings on stderr.

use super::args::ModelArgs;
use crate::usage;
use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use minfer_eval::{
    kl_divergence, perplexity, BaseLogits, ChunkReport, KldSummary, LogitsWriter, PplConfig,
};
use minfer_tokenizer::Tokenizer;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

#[derive(ClapArgs, Debug)]
#[command(
    after_help = "As llama-perplexity: the text is cut into chunks of -c tokens, each \
evaluated from an empty cache, and only each chunk's second half is scored. Save a model's \
log-probabilities with --kl-divergence-base FILE (and -f), then compare another model against \
them with --kl-divergence-base FILE --kl-divergence. The file is llama-perplexity's format: \
either tool reads the other's."
)]
pub struct Args {
    /// A GGUF path or a known model name.
    #[arg(short = 'm', long = "model", default_value = super::args::DEFAULT_MODEL)]
    pub model: String,
    /// The text to evaluate (not needed with --kl-divergence: the base file holds the tokens).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Tokens per chunk [default: 512; with --kl-divergence the base file's].
    #[arg(short = 'c', long = "ctx-size", visible_alias = "n-ctx")]
    pub ctx_size: Option<usize>,
    /// Most tokens per forward.
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    pub batch_size: usize,
    /// Evaluate at most this many chunks, at least 1 (default: all).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// With -f: save the log-probabilities here. With --kl-divergence: the base to compare to.
    #[arg(long, value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare the model against --kl-divergence-base (KLD, top-token agreement, ΔPPL).
    #[arg(long)]
    pub kl_divergence: bool,
    /// Print the final result as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// CPU threads (default: the number of physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// KV cache element type: f32, f16, q8_0 or auto.
    #[arg(long = "cache-type", default_value = "auto")]
    pub cache_type: String,
    /// Limit the backends that take part (cpu, metal, cuda).
    #[arg(long = "backend", value_delimiter = ',')]
    pub backends: Vec<String>,
    /// CPU float arithmetic (see `minfer run --help`).
    #[arg(long = "numerics", default_value = "native")]
    pub numerics: String,
    #[command(flatten)]
    pub offload: super::offload_args::OffloadArgs,
}

fn load(a: &Args, n_ctx: usize) -> anyhow::Result<minfer_engine::Engine> {
    let margs = ModelArgs {
        model: a.model.clone(),
        n_ctx: Some(n_ctx),
        // The window is the context: never sized by memory.
        kv_mem: None,
        threads: a.threads,
        cache_type: a.cache_type.clone(),
        backends: a.backends.clone(),
        numerics: a.numerics.clone(),
        offload: a.offload.clone(),
        // perplexity has no multi-GPU flags: one device.
        tensor_parallel: None,
        gpus: Vec::new(),
        split_mode: None,
    };
    Ok(margs.load()?.0)
}

fn bos_of(tok: &Tokenizer) -> Option<u32> {
    if tok.add_bos() {
        tok.special_ids().bos
    } else {
        None
    }
}

/// The chunk length when `-c` is not given (llama-perplexity's).
const DEFAULT_CHUNK: usize = 512;

/// The model's context length, when its file says (before loading it).
fn model_context(model: &str) -> anyhow::Result<Option<usize>> {
    let path = super::args::model_path(model)?;
    Ok(minfer_gguf::GgufModel::open(&path)
        .ok()
        .and_then(|m| minfer_models::HParams::from_metadata(m.metadata()).ok())
        .map(|h| h.context_length))
}

/// `-c` within what a chunk can be: at least 4 tokens, at most the model's context.
fn check_chunk(a: &Args, n: usize) -> anyhow::Result<()> {
    if n < 4 {
        usage!("-c {n}: a chunk needs at least 4 tokens (half of it is scored)");
    }
    if let Some(max) = model_context(&a.model)? {
        if n > max {
            usage!("-c {n}: past the model's context length of {max}; give -c {max} or less");
        }
    }
    Ok(())
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.chunks == Some(0) {
        usage!("--chunks 0: evaluate at least 1 chunk (leave --chunks out for all of them)");
    }
    if a.batch_size == 0 {
        // The engine's refusal read "bad decode request: perplexity: the batch size ...".
        usage!("-b 0: a forward holds at least 1 token; give -b 1 or more");
    }
    if a.kl_divergence {
        return run_kld(a);
    }
    let Some(file) = &a.file else {
        bail!("give the text with -f FILE (or --kl-divergence with a base file)");
    };
    let ctx_size = a.ctx_size.unwrap_or(DEFAULT_CHUNK);
    check_chunk(&a, ctx_size)?;
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read {} as UTF-8 text", file.display()))?;
    let mut engine = load(&a, ctx_size)?;
    if engine.n_ctx() < ctx_size {
        bail!(
            "-c {}: the model's context is only {}",
            ctx_size,
            engine.n_ctx()
        );
    }
    let tok = Tokenizer::from_metadata(engine.model().metadata())
        .context("cannot build the model's tokenizer")?;
    let t0 = std::time::Instant::now();
    let tokens = tok.encode_prompt(&text, true, false);
    eprintln!(
        "tokenized {} into {} tokens in {:.0} ms",
        file.display(),
        tokens.len(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    let cfg = PplConfig {
        n_ctx: ctx_size,
        n_batch: a.batch_size,
        n_chunks: a.chunks,
        bos: bos_of(&tok),
    };
    let mut writer = match &a.kl_divergence_base {
        Some(p) => Some(LogitsWriter::create(p)?),
        None => None,
    };
    let t0 = std::time::Instant::now();
    let mut out = std::io::stdout().lock();
    let mut on_chunk = |r: ChunkReport| {
        if r.chunk == 1 {
            let per = t0.elapsed().as_secs_f64();
            eprintln!(
                "{:.2} seconds per chunk, {} of {} tokens: ETA {:.1} minutes",
                per,
                super::count(r.n_chunks, "chunk"),
                ctx_size,
                per * r.n_chunks as f64 / 60.0
            );
        }
        if !a.json {
            // Best effort: a closed stdout must not stop the evaluation.
            let _ = write!(out, "[{}]{:.4},", r.chunk, r.ppl);
            let _ = out.flush();
        }
    };
    let res = perplexity(&mut engine, &tokens, &cfg, writer.as_mut(), &mut on_chunk)?;
    let secs = t0.elapsed().as_secs_f64();
    if a.json {
        let v = json!({
            "ppl": res.ppl, "ppl_err": res.ppl_err, "chunks": res.n_chunks,
            "n_ctx": ctx_size, "tokens_scored": res.count, "seconds": secs,
        });
        writeln!(out, "{v}")?;
    } else {
        writeln!(out)?;
        writeln!(
            out,
            "Final estimate: PPL = {:.4} +/- {:.5}",
            res.ppl, res.ppl_err
        )?;
    }
    eprintln!(
        "{}, {} scored in {:.1} s ({:.0} tokens/s)",
        super::count(res.n_chunks, "chunk"),
        super::count(res.count, "token"),
        secs,
        (res.n_chunks * ctx_size) as f64 / secs
    );
    if let Some(p) = &a.kl_divergence_base {
        eprintln!("saved log-probabilities to {}", p.display());
    }
    Ok(())
}

fn run_kld(a: Args) -> anyhow::Result<()> {
    let Some(path) = &a.kl_divergence_base else {
        bail!("--kl-divergence needs --kl-divergence-base FILE (the saved base)");
    };
    let mut base = BaseLogits::open(path)?;
    // The base file fixes the chunks: a -c or --chunks that differs is refused, not ignored.
    if let Some(c) = a.ctx_size.filter(|&c| c != base.n_ctx()) {
        usage!(
            "-c {c}: --kl-divergence compares the base file's chunks of {} tokens; leave -c out \
             (or give -c {})",
            base.n_ctx(),
            base.n_ctx()
        );
    }
    if let Some(n) = a.chunks.filter(|&n| n != base.n_chunk()) {
        usage!(
            "--chunks {n}: --kl-divergence compares every one of the base file's {} chunks; \
             leave --chunks out",
            base.n_chunk()
        );
    }
    let mut engine = load(&a, base.n_ctx())?;
    let tok = Tokenizer::from_metadata(engine.model().metadata())
        .context("cannot build the model's tokenizer")?;
    let mut out = std::io::stdout().lock();
    // The table's header comes with its first row, so a model the base file does not fit
    // (another vocabulary) fails with nothing on stdout.
    let mut header = !a.json;
    let mut on_chunk = |i: usize, s: &minfer_eval::KldStats| {
        if a.json {
            return;
        }
        if std::mem::take(&mut header) {
            let _ = writeln!(
                out,
                "chunk        PPL           ln(PPL(Q)/PPL(base))        KL Divergence        Δp RMS          Same top p"
            );
        }
        let (p, r, k, d, t) = (
            s.ppl(),
            s.ln_ppl_ratio(),
            s.kld(),
            s.p_diff_rms(),
            s.same_top(),
        );
        let _ = writeln!(
            out,
            "{i:4}    {:9.4} ± {:9.4}    {:10.5} ± {:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
            p.value, p.err, r.value, r.err, k.value, k.err,
            100.0 * d.value, 100.0 * d.err, 100.0 * t.value, 100.0 * t.err
        );
    };
    let s = kl_divergence(
        &mut engine,
        &mut base,
        a.batch_size,
        bos_of(&tok),
        &mut on_chunk,
    )?;
    if a.json {
        writeln!(out, "{}", kld_json(&s))?;
    } else {
        print_kld(&mut out, &s)?;
    }
    Ok(())
}

fn kld_json(s: &KldSummary) -> serde_json::Value {
    json!({
        "tokens": s.count,
        "ppl": s.ppl.value, "ppl_err": s.ppl.err,
        "ppl_base": s.ppl_base.value, "ppl_base_err": s.ppl_base.err,
        "ppl_diff": s.ppl_diff.value, "ppl_diff_err": s.ppl_diff.err,
        "ln_ppl_ratio": s.ln_ppl_ratio.value,
        "mean_kld": s.kld.value, "mean_kld_err": s.kld.err,
        "max_kld": s.kld_percentiles.first().map(|p| p.1),
        "same_top": s.same_top.value, "same_top_err": s.same_top.err,
        "rms_p_diff": s.p_diff_rms.value,
    })
}

fn print_kld(out: &mut impl Write, s: &KldSummary) -> std::io::Result<()> {
    writeln!(out, "\n====== Perplexity statistics ======")?;
    writeln!(
        out,
        "Mean PPL(Q)                   : {:10.6} ± {:10.6}",
        s.ppl.value, s.ppl.err
    )?;
    writeln!(
        out,
        "Mean PPL(base)                : {:10.6} ± {:10.6}",
        s.ppl_base.value, s.ppl_base.err
    )?;
    writeln!(
        out,
        "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%",
        100.0 * s.ln_ppl_correlation
    )?;
    writeln!(
        out,
        "Mean ln(PPL(Q)/PPL(base))     : {:10.6} ± {:10.6}",
        s.ln_ppl_ratio.value, s.ln_ppl_ratio.err
    )?;
    writeln!(
        out,
        "Mean PPL(Q)/PPL(base)         : {:10.6} ± {:10.6}",
        s.ppl_ratio.value, s.ppl_ratio.err
    )?;
    writeln!(
        out,
        "Mean PPL(Q)-PPL(base)         : {:10.6} ± {:10.6}",
        s.ppl_diff.value, s.ppl_diff.err
    )?;
    writeln!(out, "\n====== KL divergence statistics ======")?;
    writeln!(
        out,
        "Mean    KLD: {:10.6} ± {:10.6}",
        s.kld.value, s.kld.err
    )?;
    for (label, v) in &s.kld_percentiles {
        writeln!(out, "{label:<7} KLD: {v:10.6}")?;
    }
    writeln!(out, "\n====== Token probability statistics ======")?;
    writeln!(
        out,
        "Mean    Δp: {:6.3} ± {:5.3} %",
        100.0 * s.p_diff.value,
        100.0 * s.p_diff.err
    )?;
    for (label, v) in &s.p_diff_percentiles {
        writeln!(out, "{label:<7} Δp: {:6.3}%", 100.0 * v)?;
    }
    writeln!(
        out,
        "RMS Δp    : {:6.3} ± {:5.3} %",
        100.0 * s.p_diff_rms.value,
        100.0 * s.p_diff_rms.err
    )?;
    writeln!(
        out,
        "Same top p: {:6.3} ± {:5.3} %",
        100.0 * s.same_top.value,
        100.0 * s.same_top.err
    )?;
    Ok(())
}
