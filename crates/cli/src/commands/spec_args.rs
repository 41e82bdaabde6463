//! Speculative decoding flags shared by `run` and `chat` (issue 31): prompt lookup.

use clap::Args as ClapArgs;
use minfer_generate::lookup::LookupConfig;

#[derive(ClapArgs, Debug, Clone)]
pub struct SpecArgs {
    /// Prompt lookup decoding: draft the continuation of the latest earlier occurrence of the
    /// last N tokens (N-gram, 3 when given without a value) in the prompt and reply, and
    /// verify the drafts in the sampled token's forward. Greedy output is the same token for
    /// token; with --temp > 0 drafts are verified by speculative sampling (the plain
    /// distribution, not the plain draws of a seed); a grammar constrains the drafts too;
    /// not with --mirostat at --temp > 0. Written `--lookup=N` before a positional prompt.
    #[arg(
        long,
        value_name = "N",
        num_args = 0..=1,
        default_missing_value = "3",
        value_parser = clap::value_parser!(u32).range(1..=16)
    )]
    pub lookup: Option<u32>,
    /// Most tokens drafted for one forward (with --lookup).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub draft_max: u32,
}

impl SpecArgs {
    pub fn config(&self) -> Option<LookupConfig> {
        self.lookup.map(|n| LookupConfig {
            ngram: n as usize,
            draft_max: self.draft_max as usize,
        })
    }
}
