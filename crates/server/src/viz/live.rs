//! Live runs: the engine on its own thread takes [`RunRequest`]s and streams each run's
//! events. One forward at a time through the generation crate's steppable [`Batcher`], so
//! that between forwards the phases the trace recorded can go to the pages.

use super::{emit, RunRequest, Source, VizState};
use anyhow::Context;
use minfer_engine::{Engine, LogitsModel};
use minfer_generate::chat::Pieces;
use minfer_generate::sampler::SamplerConfig;
use minfer_generate::sched::{SchedConfig, SchedEvent, Scheduler};
use minfer_generate::{GenerateRequest, SeqGen};
use minfer_tokenizer::template::{ChatTemplate, Message, RenderOptions};
use minfer_tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;
use tokio::sync::broadcast;

impl VizState {
    /// Builds the graph of `engine`'s model and starts the engine thread, which then owns it.
    pub fn live(mut engine: Engine, model: &str) -> anyhow::Result<Arc<VizState>> {
        let graph = engine
            .graph_viz()
            .context("cannot build the decode graph")?;
        let md = engine.model().metadata();
        let tok = Tokenizer::from_metadata(md).context("cannot build the tokenizer")?;
        // A model without a usable template is prompted raw; run_start says which.
        let template = match ChatTemplate::from_metadata(md) {
            Ok(l) => Some(l.template),
            Err(e) => {
                tracing::info!("note: no chat template ({e}); prompts go to the model as raw text");
                None
            }
        };
        let hello = json!({
            "mode": "live",
            "model": model,
            "n_nodes": graph["nodes"].as_array().map_or(0, Vec::len),
            "timing": minfer_engine::trace::timing_json(&engine.node_time_sources()),
        });
        let (tx, rx) = mpsc::channel();
        let (st, busy) = VizState::new(graph, hello, Source::Live(Mutex::new(tx)));
        let st = Arc::new(st);
        let lp = Loop {
            engine,
            tok,
            template,
            events: st.events.clone(),
            busy,
            captured: st.captured.clone(),
        };
        std::thread::Builder::new()
            .name("minfer-viz-engine".into())
            .spawn(move || lp.run(rx))
            .context("cannot start the engine thread")?;
        Ok(st)
    }
}

struct Loop {
    engine: Engine,
    tok: Tokenizer,
    template: Option<ChatTemplate>,
    events: broadcast::Sender<String>,
    busy: Arc<AtomicBool>,
    captured: Arc<AtomicU64>,
}

impl Loop {
    fn run(mut self, rx: mpsc::Receiver<RunRequest>) {
        while let Ok(req) = rx.recv() {
            if let Err(e) = self.one(&req) {
                // Disarm whatever the failed run left armed; its error is the one to report.
                let _ = self.engine.trace_end();
                emit(
                    &self.events,
                    json!({"type": "error", "run": req.id, "message": format!("{e:#}")}),
                );
            }
            self.busy.store(false, Ordering::SeqCst);
        }
    }

    fn prompt(&self, text: &str) -> anyhow::Result<Vec<u32>> {
        let Some(t) = &self.template else {
            return Ok(self.tok.encode_prompt(text, true, true));
        };
        let rendered = t.render(
            &[Message::new("user", text)],
            &RenderOptions {
                add_generation_prompt: true,
                ..RenderOptions::default()
            },
        )?;
        Ok(self.tok.encode(&rendered, true))
    }

    fn one(&mut self, r: &RunRequest) -> anyhow::Result<()> {
        let prompt = self.prompt(&r.prompt)?;
        let n_ctx = self.engine.context_len();
        if prompt.len() >= n_ctx {
            anyhow::bail!(
                "the prompt has {} tokens but the context holds {n_ctx}",
                prompt.len()
            );
        }
        let req = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: r.max_tokens,
            sampler: SamplerConfig {
                temperature: r.temperature,
                ..SamplerConfig::default()
            },
            stop_strings: Vec::new(),
            eog: self.tok.eog_ids().to_vec(),
            logprobs: None,
            constraint: None,
            lookup: None,
            draft: None,
        };
        let armed = r.armed;
        emit(
            &self.events,
            json!({"type": "run_start", "run": r.id, "prompt": r.prompt,
                   "prompt_tokens": prompt.len(), "armed": armed,
                   "template": self.template.is_some()}),
        );
        self.engine.kv_clear();
        if armed {
            self.engine.trace_begin()?;
            self.captured.fetch_add(1, Ordering::SeqCst);
        }
        // One sequence the caller owns, through the same scheduler as serve's requests.
        let mut sched = Scheduler::new(SchedConfig::direct(self.engine.max_batch()));
        sched.start(
            (),
            SeqGen::new::<minfer_engine::Error>(self.engine.default_seq(), &req, n_ctx)
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        );
        let t0 = Instant::now();
        let (mut sent, mut n_tokens) = (0usize, 0usize);
        let mut out = None;
        while !sched.is_idle() {
            let mut toks: Vec<(u32, Vec<u8>)> = Vec::new();
            let mut failed = None;
            sched
                .step(&mut self.engine, &Pieces(&self.tok), |_, ev| match ev {
                    SchedEvent::Token { id, text, .. } => toks.push((id, text.to_vec())),
                    SchedEvent::Done { gen, .. } => out = Some(gen.out.clone()),
                    SchedEvent::Failed { message, .. } => failed = Some(message),
                    _ => {}
                })
                .map_err(|f| anyhow::anyhow!("generation failed: {}", f.error))?;
            if let Some(why) = failed {
                anyhow::bail!("generation failed: {why}");
            }
            let worked = sched.last_step().forwarded;
            if armed {
                let mut phases = self.engine.trace_phases_from(sent);
                sent += phases.len();
                // The token this step sampled came from its last forward's logits.
                if let (Some(p), Some((id, _))) = (phases.last_mut(), toks.last()) {
                    p.chosen = Some(*id);
                }
                for p in &phases {
                    let phase: Value = p.to_json(&Pieces(&self.tok));
                    emit(
                        &self.events,
                        json!({"type": "step", "run": r.id, "index": sent - phases.len(),
                               "phase": phase}),
                    );
                }
            }
            for (id, text) in toks {
                n_tokens += 1;
                // `text` is what became final (UTF-8 whole, maybe empty); `piece` is the
                // token's own bytes.
                let piece = minfer_engine::TokenBytes::token_bytes(&Pieces(&self.tok), id);
                emit(
                    &self.events,
                    json!({"type": "token", "run": r.id, "id": id,
                           "text": String::from_utf8_lossy(&text),
                           "piece": String::from_utf8_lossy(&piece)}),
                );
            }
            if !worked {
                break;
            }
        }
        if armed {
            self.engine.trace_end()?;
        }
        let finish = out
            .as_ref()
            .and_then(|o| serde_json::to_value(o.finish).ok())
            .unwrap_or(Value::Null);
        let t = out.map(|o| o.timings).unwrap_or_default();
        emit(
            &self.events,
            json!({"type": "run_end", "run": r.id, "finish": finish, "tokens": n_tokens,
                   "ms": t0.elapsed().as_secs_f64() * 1e3,
                   "prompt_ms": t.prompt_ms, "generate_ms": t.generate_ms,
                   "tokens_per_s": t.generate_tps(), "steps": sent}),
        );
        Ok(())
    }
}
