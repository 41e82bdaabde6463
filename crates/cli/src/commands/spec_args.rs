//! Speculative decoding flags shared by `run`, `chat` and `serve` (issue 31): prompt lookup,
//! a draft model (`--draft`, `-md`) and self-drafting (`--self-draft`).

use super::args::{model_path, ModelArgs};
use crate::usage;
use anyhow::Context;
use clap::Args as ClapArgs;
use minfer_engine::{Engine, EngineConfig};
use minfer_generate::draft::{check_vocab, DraftConfig, DraftHandle, EngineDraft};
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
    /// A draft model (`-md` as llama.cpp spells it): it proposes up to --draft-max tokens
    /// (greedy, or drawn from its own distribution at --temp > 0) that the model verifies in
    /// one forward; same guarantees as --lookup. Its vocabulary must be the model's (type,
    /// size within 128, BOS/EOS, token texts). In `serve`, the default drafter of every
    /// request lookup would support (a request opts out with `"speculative": {"draft": false}`).
    #[arg(long = "draft", value_name = "MODEL")]
    pub draft: Option<String>,
    /// Self-drafting: the model's own first LAYERS blocks, final norm and output head are
    /// the draft (no second file, the same weights, own KV); 1 to the block count minus 1.
    /// On a device backend the draft reads the model's weights on the device and runs its
    /// compiled kernels (nothing uploaded twice). In `serve` as --draft.
    #[arg(long = "self-draft", value_name = "LAYERS")]
    pub self_draft: Option<usize>,
    /// Most tokens drafted for one forward (with --lookup, --draft or --self-draft).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub draft_max: u32,
    /// A draft model's proposal shorter than N tokens is not verified (0: any).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub draft_min: u32,
    /// A draft model stops before a token it gives less than P probability.
    #[arg(long, value_name = "P", default_value_t = 0.75)]
    pub draft_p_min: f32,
    /// The draft model's backend (default: the model's --backend).
    #[arg(long = "draft-backend", value_name = "NAME")]
    pub draft_backend: Option<String>,
}

impl SpecArgs {
    pub fn config(&self) -> Option<LookupConfig> {
        self.lookup.map(|n| LookupConfig {
            ngram: n as usize,
            draft_max: self.draft_max as usize,
        })
    }

    /// Usage errors before anything loads: one drafter at a time, `--draft-p-min` a
    /// probability, the draft flags only with a draft.
    pub fn check(&self) -> anyhow::Result<()> {
        let drafters = [
            self.lookup.map(|_| "--lookup"),
            self.draft.as_ref().map(|_| "--draft"),
            self.self_draft.map(|_| "--self-draft"),
        ];
        let given: Vec<&str> = drafters.into_iter().flatten().collect();
        if given.len() > 1 {
            usage!("{}: one drafter at a time", given.join(" and "));
        }
        if !(0.0..=1.0).contains(&self.draft_p_min) {
            usage!("--draft-p-min {}: expected 0 to 1", self.draft_p_min);
        }
        if self.draft_min > self.draft_max {
            usage!(
                "--draft-min {} is above --draft-max {}: no proposal could be verified",
                self.draft_min,
                self.draft_max
            );
        }
        if self.draft_backend.is_some() && self.draft.is_none() && self.self_draft.is_none() {
            usage!("--draft-backend applies to --draft or --self-draft");
        }
        Ok(())
    }

    /// The draft engine `--draft` or `--self-draft` asks for, after the target loaded: its
    /// context and threads are the target's, its backend `--draft-backend` or the target's.
    /// `many`: it drafts for several sequences at once (`serve`: a draft sequence per
    /// running sequence, [`EngineDraft::multi`]); else one at a time (`run`, `chat`).
    pub fn draft_handle(
        &self,
        target: &Engine,
        model: &ModelArgs,
        many: bool,
    ) -> anyhow::Result<Option<DraftHandle>> {
        let engine_draft = |draft: Engine| {
            if many {
                EngineDraft::multi(draft)
            } else {
                EngineDraft::new(draft)
            }
        };
        let cfg = DraftConfig {
            draft_max: self.draft_max as usize,
            draft_min: self.draft_min as usize,
            p_min: self.draft_p_min,
        };
        let engine_cfg = EngineConfig {
            n_ctx: target.n_ctx(),
            threads: model.threads.unwrap_or(0),
            cache_type: target.cache_type(),
            backends: match &self.draft_backend {
                Some(b) => vec![b.clone()],
                None => model.backends.clone(),
            },
            ..EngineConfig::default()
        };
        let vocab = target.hparams().vocab_size;
        if let Some(layers) = self.self_draft {
            let mut draft = target
                .self_draft(layers, engine_cfg)
                .context("cannot start the self-draft")?;
            let on = draft
                .nodes_per_backend(1)
                .ok()
                .and_then(|n| n.into_iter().find(|(b, k)| b != "cpu" && *k > 0))
                .map_or_else(String::new, |(b, _)| {
                    format!(", shared with the model on {b}")
                });
            // On a device whose free memory would not hold the draft's KV at the model's
            // context, the draft takes the cells that fit (Engine::self_draft).
            let ctx = if draft.n_ctx() < target.n_ctx() {
                format!(
                    "; its context {} of {} tokens (the device's free memory), longer sequences decode without drafts",
                    draft.n_ctx(),
                    target.n_ctx()
                )
            } else {
                String::new()
            };
            eprintln!(
                "self-draft: the first {layers} of {} blocks, final norm and output head (the same weights{on}){ctx}",
                target.hparams().block_count
            );
            return Ok(Some(DraftHandle::new(engine_draft(draft), cfg)));
        }
        let Some(name) = &self.draft else {
            return Ok(None);
        };
        let path = model_path(name)?;
        let draft = Engine::load(&path, engine_cfg)
            .with_context(|| format!("cannot load the draft model {}", path.display()))?;
        if let Err(why) = check_vocab(target.model().metadata(), draft.model().metadata()) {
            anyhow::bail!(
                "--draft {}: its vocabulary is not the model's: {why}",
                path.display()
            );
        }
        let draft_vocab = draft.hparams().vocab_size;
        eprintln!(
            "draft:     {} ({} blocks), draft-max {}, draft-p-min {}",
            path.display(),
            draft.hparams().block_count,
            cfg.draft_max,
            cfg.p_min
        );
        Ok(Some(DraftHandle::new(
            engine_draft(draft).with_vocab(draft_vocab, vocab),
            cfg,
        )))
    }

    /// The drafter as a startup line names it: `draft model PATH` or `self-draft LAYERS`.
    pub fn drafter_label(&self) -> String {
        match (&self.draft, self.self_draft) {
            (Some(m), _) => format!("draft model {m}"),
            (None, Some(l)) => format!("self-draft, the first {l} blocks"),
            (None, None) => "lookup".into(),
        }
    }

    /// The name the stats line gives the drafter.
    pub fn drafter_name(&self) -> &'static str {
        if self.draft.is_some() {
            "draft"
        } else if self.self_draft.is_some() {
            "self-draft"
        } else {
            "lookup"
        }
    }
}
