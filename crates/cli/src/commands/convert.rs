//! `minfer convert HF_DIR OUT.gguf [--outtype f32|f16|bf16|q8_0]`: a Hugging Face Qwen2,
//! Qwen3 or LLaMA checkpoint to GGUF as llama.cpp's convert_hf_to_gguf.py writes it.

use anyhow::Context;
use clap::{Args as ClapArgs, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use minfer_convert::OutType;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum OutTypeArg {
    F32,
    F16,
    Bf16,
    #[value(name = "q8_0")]
    Q8_0,
}

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The checkpoint directory (config.json, tokenizer.json, tokenizer_config.json,
    /// model.safetensors or shards with model.safetensors.index.json).
    pub dir: PathBuf,
    /// The GGUF file to write (must not exist unless --force).
    pub output: PathBuf,
    /// Weight type of the 2-D tensors (norms, biases and 1-D tensors stay f32).
    #[arg(long, value_enum, default_value = "f16")]
    pub outtype: OutTypeArg,
    #[command(flatten)]
    pub force: super::output::ForceArg,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    super::output::check_output(&args.output, &[], args.force.force)?;
    let t0 = std::time::Instant::now();
    let out = match args.outtype {
        OutTypeArg::F32 => OutType::F32,
        OutTypeArg::F16 => OutType::F16,
        OutTypeArg::Bf16 => OutType::Bf16,
        OutTypeArg::Q8_0 => OutType::Q8_0,
    };
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("convert [{bar:40}] {pos}/{len} tensors ({eta})")
            .expect("static template"),
    );
    let report = minfer_convert::convert(&args.dir, &args.output, out, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .with_context(|| format!("cannot convert {}", args.dir.display()))?;
    bar.finish_and_clear();
    for n in &report.notes {
        eprintln!("note: {n}");
    }
    println!(
        "wrote {} ({}, {} tensors, {:?}) in {:.2} s",
        args.output.display(),
        report.arch,
        report.n_tensors,
        args.outtype,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
