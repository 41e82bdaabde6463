//! `minfer quantize IN OUT TYPE`: llama-quantize's mixtures and options over
//! `minfer_quantize`; progress on stderr.

use anyhow::Context;
use clap::Args as ClapArgs;
use indicatif::{ProgressBar, ProgressStyle};
use minfer_gguf::GgmlType;
use minfer_quantize::{quantize_model, Event, Ftype, Imatrix, ImatrixFormat, Options};
use std::path::PathBuf;

#[derive(ClapArgs, Debug)]
#[command(
    after_help = "TYPE is a file type as llama-quantize names it: F32 F16 BF16 Q4_0 Q4_1 \
Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M (Q3_K) Q3_K_L Q4_K_S Q4_K_M (Q4_K) Q5_K_S Q5_K_M (Q5_K) Q6_K \
IQ4_NL IQ4_XS. The output is byte-identical to llama-quantize's for the same input and options, \
--imatrix included (both of llama-imatrix's formats: GGUF and the legacy .dat)."
)]
pub struct Args {
    /// Source model (GGUF; any part of a split set).
    pub input: PathBuf,
    /// Output file; with --keep-split, the parts' name prefix (a trailing .gguf is dropped).
    pub output: PathBuf,
    /// File type (mixture), e.g. Q4_K_M.
    #[arg(value_name = "TYPE")]
    pub ftype: String,
    /// One type for every quantized tensor: no per-tensor mixture rules.
    #[arg(long)]
    pub pure: bool,
    /// Type of output.weight (and of a tied token embedding), e.g. q8_0.
    #[arg(long, value_name = "GGML_TYPE")]
    pub output_tensor_type: Option<String>,
    /// Type of token_embd.weight.
    #[arg(long, value_name = "GGML_TYPE")]
    pub token_embedding_type: Option<String>,
    /// PATTERN=GGML_TYPE: tensors whose name matches the regex PATTERN get that type
    /// (repeatable; the first match wins).
    #[arg(long = "tensor-type", value_name = "PATTERN=GGML_TYPE")]
    pub tensor_type: Vec<String>,
    /// Keep output.weight unquantized (its source type).
    #[arg(long)]
    pub leave_output_tensor: bool,
    /// Dequantize quantized source tensors and quantize them again (quality suffers).
    #[arg(long)]
    pub allow_requantize: bool,
    /// Importance matrix made by llama-imatrix (GGUF or legacy .dat): weights the
    /// quantization error per column, as llama-quantize --imatrix does.
    #[arg(long, value_name = "FILE")]
    pub imatrix: Option<PathBuf>,
    /// Use the imatrix only for tensors whose name contains NAME (repeatable).
    #[arg(
        long,
        value_name = "NAME",
        requires = "imatrix",
        conflicts_with = "exclude_weights"
    )]
    pub include_weights: Vec<String>,
    /// Do not use the imatrix for tensors whose name contains NAME (repeatable).
    #[arg(long, value_name = "NAME", requires = "imatrix")]
    pub exclude_weights: Vec<String>,
    /// Write the output as a split set with the input's parts, OUT-00001-of-0000N.gguf and
    /// so on, as llama-quantize --keep-split does (an unsplit input gives one part,
    /// OUT-00001-of-00001.gguf).
    #[arg(long)]
    pub keep_split: bool,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    #[command(flatten)]
    pub force: super::output::ForceArg,
}

/// `1 tensor`, `2 tensors`.
fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// The files `quantize` will write: OUT, or with --keep-split one part per input part.
fn output_paths(a: &Args, n_in_parts: usize) -> Vec<PathBuf> {
    if !a.keep_split {
        return vec![a.output.clone()];
    }
    let name = a.output.file_name().and_then(|s| s.to_str()).unwrap_or("");
    let stem = name.strip_suffix(".gguf").unwrap_or(name);
    let dir = a.output.parent().unwrap_or(std::path::Path::new(""));
    (0..n_in_parts)
        .map(|k| minfer_gguf::model::split_path(dir, stem, k as u32 + 1, n_in_parts as u32))
        .collect()
}

fn ggml_type(flag: &str, s: &str) -> anyhow::Result<GgmlType> {
    GgmlType::from_name(s).with_context(|| format!("{flag}: unknown ggml type {s:?}"))
}

fn options(a: &Args) -> anyhow::Result<Options> {
    let ftype = Ftype::from_name(&a.ftype).with_context(|| {
        let names: Vec<&str> = Ftype::names().collect();
        format!(
            "unknown quantization type {:?} (known: {})",
            a.ftype,
            names.join(" ")
        )
    })?;
    let mut o = Options::new(ftype);
    if let Some(p) = &a.imatrix {
        let mut m = Imatrix::load(p).with_context(|| format!("--imatrix {}", p.display()))?;
        let n = m.entries.len();
        m.filter(&a.include_weights, &a.exclude_weights);
        eprintln!(
            "imatrix {}: {} entries ({} format{}), {} used",
            p.display(),
            n,
            match m.format {
                ImatrixFormat::Gguf => "GGUF",
                ImatrixFormat::Legacy => "legacy .dat",
            },
            match (m.datasets.first(), m.chunk_count) {
                (Some(d), c) if c > 0 => format!(", {c} chunks of {d}"),
                (Some(d), _) => format!(", dataset {d}"),
                (None, c) if c > 0 => format!(", {c} chunks"),
                _ => String::new(),
            },
            m.entries.len()
        );
        if m.entries.is_empty() {
            eprintln!(
                "warning: --include-weights/--exclude-weights left no imatrix entries: \
                 quantizing without an importance matrix"
            );
        }
        o.imatrix = Some(m);
    }
    o.pure = a.pure;
    o.allow_requantize = a.allow_requantize;
    o.leave_output_tensor = a.leave_output_tensor;
    o.threads = a.threads;
    o.keep_split = a.keep_split;
    o.output_tensor_type = a
        .output_tensor_type
        .as_deref()
        .map(|s| ggml_type("--output-tensor-type", s))
        .transpose()?;
    o.token_embedding_type = a
        .token_embedding_type
        .as_deref()
        .map(|s| ggml_type("--token-embedding-type", s))
        .transpose()?;
    for tt in &a.tensor_type {
        let (pat, ty) = tt
            .split_once('=')
            .filter(|(p, t)| !p.is_empty() && !t.is_empty())
            .with_context(|| format!("--tensor-type {tt:?}: expected PATTERN=GGML_TYPE"))?;
        o.tensor_types
            .push((pat.to_string(), ggml_type("--tensor-type", ty)?));
    }
    Ok(o)
}

pub fn run(mut a: Args) -> anyhow::Result<()> {
    a.input = super::args::model_file(&a.input)?;
    super::args::not_a_directory(&a.input, "the input")?;
    let inputs: Vec<PathBuf> = match minfer_gguf::GgufModel::open(&a.input) {
        Ok(m) => m.parts().iter().map(|p| p.path().to_path_buf()).collect(),
        Err(_) => vec![a.input.clone()],
    };
    super::output::check_outputs(&output_paths(&a, inputs.len()), &inputs, a.force.force)?;
    let opts = options(&a)?;
    let t0 = std::time::Instant::now();
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} tensors {msg}")
            .expect("a valid progress template"),
    );
    let mut unweighted: Vec<String> = Vec::new();
    // Requantized tensors are counted and reported once, after the bar (a line per tensor
    // flooded a terminal and, through the hidden bar, vanished when stderr was a file).
    let mut requantized = 0usize;
    let mut requantized_from: Vec<GgmlType> = Vec::new();
    let mut on_event = |e: Event| {
        match e {
            Event::Planned { tensors, .. } => bar.set_length(tensors as u64),
            // Printed above the bar on a terminal, and to a redirected stderr too (the bar's
            // own println draws nothing when it is hidden).
            Event::Fallback(f) => bar.suspend(|| {
                eprintln!(
                    "warning: {} - ncols {} not divisible by the {} block; falling back to {}",
                    f.tensor, f.ncols, f.wanted, f.got
                )
            }),
            Event::ImatrixMissing { tensor } => unweighted.push(tensor),
            Event::ImatrixIgnored { tensor, got, want } => bar.suspend(|| {
                eprintln!(
                    "warning: imatrix entry {tensor} has {got} values for {want} columns; \
             quantized without importance weights"
                )
            }),
            Event::Requantize { tensor: _, from } => {
                requantized += 1;
                if !requantized_from.contains(&from) {
                    requantized_from.push(from);
                }
            }
            Event::Tensor { name, from, to, .. } => {
                bar.set_message(format!("{name} {from} -> {to}"));
                bar.inc(1);
            }
        }
    };
    let summary = quantize_model(&a.input, &a.output, &opts, &mut on_event)
        .with_context(|| format!("quantizing {}", a.input.display()))?;
    bar.finish_and_clear();
    if !unweighted.is_empty() {
        eprintln!(
            "note: the imatrix has no entry for {} quantized {}, quantized without \
             importance weights: {}",
            unweighted.len(),
            if unweighted.len() == 1 {
                "tensor"
            } else {
                "tensors"
            },
            unweighted.join(" ")
        );
    }
    if requantized > 0 {
        eprintln!(
            "warning: requantized {requantized} tensor{} from {}: quality is lower than from the \
             original (f16/f32) weights",
            if requantized == 1 { "" } else { "s" },
            requantized_from
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if a.keep_split && summary.outputs.len() == 1 {
        eprintln!("note: --keep-split on an unsplit input writes a single part");
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let wrote: Vec<String> = summary
        .outputs
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    eprintln!(
        "quantized {} tensors: {:.2} MiB -> {:.2} MiB ({}) in {:.1} s; wrote {}",
        summary.tensors,
        mib(summary.bytes_in),
        mib(summary.bytes_out),
        opts.ftype.name(),
        t0.elapsed().as_secs_f64(),
        wrote.join(" ")
    );
    if summary.fallbacks > 0 {
        eprintln!(
            "warning: {} required fallback quantization",
            count(summary.fallbacks, "tensor")
        );
    }
    Ok(())
}
