//! `minfer synth`: write a GGUF model of a chosen architecture and shape with seeded random
//! weights (tests and benchmarks of shapes we have no real file for).

use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use indicatif::{ProgressBar, ProgressStyle};
use minfer_gguf::GgmlType;
use minfer_models::synth::{self, SynthSpec};
use minfer_models::Arch;
use std::num::NonZeroUsize;
use std::path::PathBuf;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Start from a named shape: 7b (Qwen2.5-7B) or 0.5b (Qwen2.5-0.5B); flags override it.
    #[arg(long)]
    pub preset: Option<String>,
    /// Architecture: qwen2, qwen3 or llama.
    #[arg(long)]
    pub arch: Option<String>,
    /// Number of transformer blocks (layers).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Embedding length (hidden size).
    #[arg(long)]
    pub embd: Option<usize>,
    /// Attention (query) heads.
    #[arg(long)]
    pub heads: Option<usize>,
    /// Key/value heads (grouped-query attention: a divisor of --heads).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Per-head dimension (default embd / heads).
    #[arg(long)]
    pub head_dim: Option<usize>,
    /// Feed-forward (intermediate) length.
    #[arg(long)]
    pub ffn: Option<usize>,
    /// Vocabulary size (default: the tokenizer's; pads the built-in tokenizer).
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Context length written into the metadata (default 4096).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Type of the 2-D weights (f32, f16, bf16, q8_0, q4_k, ...); norms and biases stay F32.
    #[arg(long = "type", default_value = "f32")]
    pub weight_type: String,
    /// Type for matrices whose row length is not whole blocks of --type.
    #[arg(long)]
    pub fallback_type: Option<String>,
    /// Seed of the random weights (the same seed and shape give the same bytes).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Copy every tokenizer.* key from this GGUF (the vocabulary size follows it).
    #[arg(long)]
    pub tokenizer_from: Option<PathBuf>,
    /// Tie the output projection to the token embedding (no output.weight).
    #[arg(long)]
    pub tied: bool,
    /// Threads encoding the weights (0 or no -t: every CPU available); the file's bytes are
    /// the same for every count.
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Output file.
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    /// Overwrite an existing output, and write a file larger than the free space.
    #[command(flatten)]
    pub force: super::output::ForceArg,
}

fn parse_type(s: &str) -> anyhow::Result<GgmlType> {
    GgmlType::from_name(s)
        .ok_or_else(|| super::UsageError(format!("unknown weight type {s:?}")).into())
}

fn spec(args: &Args) -> anyhow::Result<SynthSpec> {
    let mut s = match (&args.preset, &args.arch) {
        (Some(p), _) => SynthSpec::preset(p)?,
        (None, Some(_)) => {
            let need = |v: Option<usize>, flag: &str| {
                v.ok_or_else(|| super::UsageError(format!("--{flag} is required without --preset")))
            };
            SynthSpec::new(
                Arch::Qwen2,
                need(args.layers, "layers")?,
                need(args.embd, "embd")?,
                need(args.heads, "heads")?,
                need(args.kv_heads, "kv-heads")?,
                need(args.ffn, "ffn")?,
            )
        }
        (None, None) => crate::usage!("give --preset or --arch with a shape"),
    };
    if let Some(a) = &args.arch {
        let arch = Arch::from_name(a)?;
        if arch != s.arch {
            // Epsilon and RoPE base follow the architecture.
            let d = SynthSpec::new(arch, 1, 1, 1, 1, 1);
            (s.rms_epsilon, s.rope_freq_base) = (d.rms_epsilon, d.rope_freq_base);
        }
        s.arch = arch;
    }
    let set = |slot: &mut usize, v: Option<usize>| {
        if let Some(v) = v {
            *slot = v;
        }
    };
    set(&mut s.block_count, args.layers);
    set(&mut s.embedding_length, args.embd);
    set(&mut s.head_count, args.heads);
    set(&mut s.head_count_kv, args.kv_heads);
    set(&mut s.feed_forward_length, args.ffn);
    set(&mut s.context_length, args.ctx);
    s.head_dim = args.head_dim.or(s.head_dim);
    s.vocab_size = args.vocab.or(s.vocab_size);
    s.weight_type = parse_type(&args.weight_type)?;
    s.fallback_type = args.fallback_type.as_deref().map(parse_type).transpose()?;
    s.seed = args.seed;
    s.tied_embeddings |= args.tied;
    if let Some(donor) = &args.tokenizer_from {
        let tok = synth::tokenizer_from(donor)
            .with_context(|| format!("tokenizer donor {}", donor.display()))?;
        // A preset's vocabulary size yields to the donor's; an explicit --vocab must agree.
        if args.vocab.is_none() {
            s.vocab_size = None;
        }
        s.tokenizer = Some(tok);
    }
    Ok(s)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let spec = spec(&args)?;
    let force = args.force.force;
    super::output::check_output(&args.output, &[], force)?;
    // The size is known before a byte is written: said, and checked against the free space.
    let planned = synth::plan(&spec)?;
    let size = planned.data_bytes();
    let n = planned.tensors().count();
    let human = super::output::human_bytes(size);
    eprintln!(
        "synth: {n} tensor{}, {human} of weights to {}",
        if n == 1 { "" } else { "s" },
        args.output.display()
    );
    let dir = super::output::dir_of(&args.output);
    if let Some(free) = super::output::free_bytes(&dir) {
        if size > free && !force {
            bail!(
                "the model would take {human}, more than the {} free in {}; choose a smaller shape \
                 (--layers, --embd, --ffn, --vocab) or pass --force to write it anyway",
                super::output::human_bytes(free),
                dir.display()
            );
        }
    }
    let cpus = synth::all_threads();
    let threads = match args.threads.and_then(NonZeroUsize::new) {
        Some(t) => t,
        None => cpus,
    };
    if threads > cpus {
        eprintln!(
            "warning: -t {threads} is more threads than the {cpus} CPUs available; they share cores (0 or no -t: one per CPU)"
        );
    }
    let t0 = std::time::Instant::now();
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})")
            .expect("static template"),
    );
    bar.set_message("synth");
    let plan = synth::write_synth_threads(&spec, &args.output, threads, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .with_context(|| format!("cannot write {}", args.output.display()))?;
    bar.finish_and_clear();
    let n_tensors = plan.tensors().count();
    // Tensors per type, so a fallback type's share is visible.
    let mut per_type: Vec<(GgmlType, usize)> = Vec::new();
    for t in plan.tensors() {
        match per_type.iter_mut().find(|(ty, _)| *ty == t.ty) {
            Some((_, n)) => *n += 1,
            None => per_type.push((t.ty, 1)),
        }
    }
    per_type.sort();
    let types: Vec<String> = per_type.iter().map(|(t, n)| format!("{n} {t}")).collect();
    let bytes = std::fs::metadata(&args.output)?.len();
    println!(
        "wrote {} ({}, {} tensors: {}; {:.1} MB) in {:.2} s on {} threads",
        args.output.display(),
        spec.arch.name(),
        n_tensors,
        types.join(", "),
        bytes as f64 / 1e6,
        t0.elapsed().as_secs_f64(),
        threads
    );
    Ok(())
}
