//! The model drafters on the real models (issue 31), on the CPU; each test prints a SKIP line
//! and passes where its model is not cached. Greedy output byte-identical to plain decoding
//! on the 20 generated code-edit prompts (SmolLM2-135M) and on three with the demo model
//! (Qwen2.5-Coder-0.5B), for: the model drafting for itself (every draft accepted: the
//! acceptance is printed and asserted), a synthetic draft of the same vocabulary (a one-block
//! random model carrying the target's tokenizer: almost every draft rejected) and
//! self-drafting. Controls: drafts ran, and were accepted or rejected as claimed.

mod common;

use common::code_edits::prompts;
use minfer_engine::{Engine, EngineConfig};
use minfer_generate::chat::Pieces;
use minfer_generate::draft::{check_vocab, DraftConfig, DraftHandle, EngineDraft};
use minfer_generate::{generate, GenerateRequest};
use minfer_models::synth::{synthesize, tokenizer_from, SynthSpec};
use minfer_models::Arch;
use minfer_tokenizer::template::{ChatTemplate, Message, RenderOptions};
use minfer_tokenizer::Tokenizer;
use std::path::Path;

fn cfg() -> EngineConfig {
    EngineConfig {
        n_ctx: 2048,
        ..EngineConfig::default()
    }
}

fn handle(draft: Engine) -> DraftHandle {
    let cfg = DraftConfig {
        draft_max: 8,
        draft_min: 0,
        p_min: 0.0,
    };
    DraftHandle::new(EngineDraft::new(draft), cfg)
}

/// Greedy replies with and without the draft; asserts every reply is the same, returns
/// (drafted, accepted).
fn compare(
    target: &mut Engine,
    draft: &DraftHandle,
    prompts: &[String],
    max_tokens: usize,
) -> (usize, usize) {
    let md = target.model().metadata();
    let tok = Tokenizer::from_metadata(md).unwrap();
    let template = ChatTemplate::from_metadata(md).unwrap().template;
    let (mut drafted, mut accepted) = (0, 0);
    for (i, p) in prompts.iter().enumerate() {
        let opts = RenderOptions {
            add_generation_prompt: true,
            ..RenderOptions::default()
        };
        let text = template
            .render(&[Message::user(p.as_str())], &opts)
            .unwrap();
        let req = |draft| GenerateRequest {
            draft,
            ..common::greedy_request(&tok, &text, max_tokens)
        };
        target.kv_clear();
        let plain = generate(target, &Pieces(&tok), &req(None), |_| {}).unwrap();
        target.kv_clear();
        let spec = generate(target, &Pieces(&tok), &req(Some(draft.clone())), |_| {}).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&plain.text),
            String::from_utf8_lossy(&spec.text),
            "prompt {i} differs with the draft"
        );
        assert_eq!(plain.tokens, spec.tokens, "prompt {i}");
        let s = spec.speculative.unwrap();
        drafted += s.drafted;
        accepted += s.accepted;
    }
    (drafted, accepted)
}

/// A one-block random model (width 64) carrying `model`'s tokenizer.
fn synthetic_draft(model: &Path) -> Engine {
    let mut spec = SynthSpec::new(Arch::Qwen2, 1, 64, 4, 2, 128);
    spec.tokenizer = Some(tokenizer_from(model).unwrap());
    spec.seed = 31;
    let p = std::env::temp_dir().join(format!("minfer-draft-real-{}.gguf", std::process::id()));
    std::fs::write(&p, synthesize(&spec).unwrap().to_bytes()).unwrap();
    let e = Engine::load(&p, cfg()).unwrap();
    let _ = std::fs::remove_file(&p);
    e
}

fn all_three(model: &Path, prompts: &[String], max_tokens: usize, name: &str) {
    let mut target = Engine::load(model, cfg()).unwrap();
    // The model drafting for itself: every draft is the target's own pick.
    let (d, a) = compare(
        &mut target,
        &handle(Engine::load(model, cfg()).unwrap()),
        prompts,
        max_tokens,
    );
    eprintln!("{name} drafting for itself: {a} of {d} drafts accepted");
    assert!(d > 0);
    assert_eq!(a, d, "the model drafting for itself had a draft rejected");
    // A synthetic draft of the same vocabulary: almost every draft rejected.
    let synth = synthetic_draft(model);
    check_vocab(target.model().metadata(), synth.model().metadata()).unwrap();
    let (d, a) = compare(&mut target, &handle(synth), prompts, max_tokens);
    eprintln!("{name} with a synthetic draft: {a} of {d} drafts accepted");
    assert!(d > 0 && a * 4 < d, "{a} of {d}");
    // Self-drafting on half the blocks.
    let layers = target.hparams().block_count / 2;
    let draft = target.self_draft(layers, cfg()).unwrap();
    let (d, a) = compare(&mut target, &handle(draft), prompts, max_tokens);
    eprintln!("{name} self-drafting on {layers} blocks: {a} of {d} drafts accepted");
    assert!(d > 0);
}

#[test]
fn drafted_replies_equal_plain_ones_on_twenty_code_edits() {
    let Some(m) = minfer_testkit::models::smol() else {
        return;
    };
    all_three(&m, &prompts(), 96, "smollm2");
}

#[test]
fn drafted_replies_equal_plain_ones_on_the_demo_model() {
    let Some(m) = minfer_testkit::models::qwen() else {
        return;
    };
    let all = prompts();
    let some = [all[0].clone(), all[9].clone(), all[18].clone()];
    all_three(&m, &some, 64, "qwen2.5-coder-0.5b");
}
