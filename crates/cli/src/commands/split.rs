//! `minfer split IN OUT_PREFIX`: cut a model into `OUT_PREFIX-0000k-of-0000n.gguf` parts the
//! way llama-gguf-split does (same options, names, keys and bytes for 32-byte-aligned
//! models; see `minfer_gguf::split` for where and why we differ).

use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use indicatif::{ProgressBar, ProgressStyle};
use minfer_gguf::split::{self, FirstPart, SplitLimit, SplitOptions};
use minfer_gguf::GgufModel;
use std::path::PathBuf;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The model to split: a path (any part of a split model opens all parts) or a model
    /// name as for `-m`.
    pub input: PathBuf,
    /// Output prefix: parts are written as PREFIX-00001-of-0000N.gguf.
    pub output: PathBuf,
    /// Most padded tensor bytes per part: N, NK, NM or NG (decimal units, as
    /// llama-gguf-split: 1M = 1000000). Metadata is not counted.
    #[arg(long = "split-max-size", value_parser = parse_size, conflicts_with = "max_tensors")]
    pub max_size: Option<u64>,
    /// Most tensors per part (llama-gguf-split's default mode; default 128).
    #[arg(long = "split-max-tensors")]
    pub max_tensors: Option<usize>,
    /// Put no tensors in the first part (metadata only).
    #[arg(long = "no-tensor-first-split")]
    pub no_tensor_first_split: bool,
    /// Print the plan and write nothing.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    #[command(flatten)]
    pub force: super::output::ForceArg,
}

fn parse_size(s: &str) -> Result<u64, String> {
    split::parse_size(s).map_err(|e| e.to_string())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let input = super::args::model_file(&args.input)?;
    super::args::not_a_directory(&input, "the input")?;
    let model =
        GgufModel::open(&input).with_context(|| format!("cannot open {}", input.display()))?;
    let limit = match (args.max_size, args.max_tensors) {
        (Some(b), _) => SplitLimit::MaxBytes(b),
        (None, Some(0)) => bail!("--split-max-tensors must be positive"),
        (None, n) => SplitLimit::MaxTensors(n.unwrap_or(128)),
    };
    let first_part = if args.no_tensor_first_split {
        FirstPart::MetadataOnly
    } else {
        FirstPart::WithTensors
    };
    let plan = split::plan_split(&model, SplitOptions { limit, first_part })?;
    for &i in &plan.oversized {
        let t = &model.tensors()[i].info;
        eprintln!(
            "warning: tensor {} ({} bytes) is larger than --split-max-size; it gets a part of its own",
            t.name, t.n_bytes
        );
    }
    println!("n_split: {}", plan.parts.len());
    for (k, (idx, size)) in plan.parts.iter().zip(&plan.part_sizes).enumerate() {
        println!(
            "split {:05}: n_tensors = {}, total_size = {}M",
            k + 1,
            idx.len(),
            size / 1_000_000
        );
    }
    if args.dry_run {
        return Ok(());
    }
    if let Some(why) = split::canonical_layout(&model)? {
        eprintln!(
            "note: {} is not in ggml's canonical layout ({why}); merging the parts gives the same \
             metadata and tensors, not the same bytes",
            args.input.display()
        );
    }
    let inputs: Vec<PathBuf> = model.parts().iter().map(|p| p.path().into()).collect();
    let n = plan.parts.len() as u32;
    let stem = args
        .output
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or("");
    let dir = args.output.parent().unwrap_or(std::path::Path::new(""));
    let outs: Vec<PathBuf> = (1..=n)
        .map(|k| minfer_gguf::model::split_path(dir, stem, k, n))
        .collect();
    // Existing parts (allowed by --force) are replaced by the crash-safe renames, not
    // removed first: an interrupted split must leave the old files whole.
    super::output::check_outputs(&outs, &inputs, args.force.force)?;
    let total: u64 = model.tensors().iter().map(|t| t.info.n_bytes).sum();
    let bar = bytes_bar(total, "split");
    let paths = split::write_split_replacing(&model, &plan, &args.output, &mut |n| bar.inc(n))?;
    bar.finish_and_clear();
    for p in &paths {
        println!("wrote {}", p.display());
    }
    eprintln!(
        "{} parts, {} tensors in {:.2} s",
        paths.len(),
        plan.n_tensors,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A byte-count bar on stderr (hidden when stderr is not a terminal).
pub fn bytes_bar(total: u64, msg: &str) -> ProgressBar {
    ProgressBar::new(total)
        .with_style(
            ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})")
                .expect("static template"),
        )
        .with_message(msg.to_string())
}
