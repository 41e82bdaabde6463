//! Prompt lookup decoding on the real models (issue 31): greedy output byte-identical to plain
//! decoding on 20 generated code-edit prompts (SmolLM2-135M) and on three with the demo model
//! (Qwen2.5-Coder-0.5B), on the CPU. Controls: drafts were really verified and accepted (the
//! comparison would be plain against plain otherwise), and fewer forwards ran.

use minfer_engine::{Engine, EngineConfig};
use minfer_generate::chat::Pieces;
use minfer_generate::lookup::LookupConfig;
use minfer_generate::sampler::SamplerConfig;
use minfer_generate::{generate, GenerateRequest};
use minfer_tokenizer::template::{ChatTemplate, Message, RenderOptions};
use minfer_tokenizer::Tokenizer;
use std::path::Path;

mod common;
use common::code_edits::prompts;

/// Greedy replies to `prompts` with and without lookup; returns (drafted, accepted,
/// forwards saved) over all of them after asserting every reply is the same.
fn compare(model: &Path, prompts: &[String], max_tokens: usize) -> (usize, usize) {
    let mut engine = Engine::load(model, EngineConfig::default()).unwrap();
    let md = engine.model().metadata();
    let tok = Tokenizer::from_metadata(md).unwrap();
    let template = ChatTemplate::from_metadata(md).unwrap().template;
    let (mut drafted, mut accepted) = (0, 0);
    for (i, p) in prompts.iter().enumerate() {
        let text = template
            .render(
                &[Message::user(p.as_str())],
                &RenderOptions {
                    add_generation_prompt: true,
                    ..RenderOptions::default()
                },
            )
            .unwrap();
        let req = |lookup| GenerateRequest {
            lookup,
            ..common::greedy_request(&tok, &text, max_tokens)
        };
        engine.kv_clear();
        let plain = generate(&mut engine, &Pieces(&tok), &req(None), |_| {}).unwrap();
        engine.kv_clear();
        let cfg = LookupConfig::default();
        let spec = generate(&mut engine, &Pieces(&tok), &req(Some(cfg)), |_| {}).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&plain.text),
            String::from_utf8_lossy(&spec.text),
            "prompt {i} differs with lookup"
        );
        assert_eq!(plain.tokens, spec.tokens, "prompt {i}");
        let s = spec.speculative.unwrap();
        drafted += s.drafted;
        accepted += s.accepted;
    }
    (drafted, accepted)
}

#[test]
fn lookup_replies_equal_plain_ones_on_twenty_code_edits() {
    let Some(m) = minfer_testkit::models::smol() else {
        return;
    };
    let (drafted, accepted) = compare(&m, &prompts(), 96);
    eprintln!("smollm2: {accepted} of {drafted} drafts accepted");
    assert!(
        accepted * 4 > drafted,
        "{accepted} of {drafted}: lookup did little"
    );
}

#[test]
fn lookup_replies_equal_plain_ones_on_the_demo_model() {
    let Some(m) = minfer_testkit::models::qwen() else {
        return;
    };
    let all = prompts();
    let some = [all[0].clone(), all[9].clone(), all[18].clone()];
    let (drafted, accepted) = compare(&m, &some, 64);
    eprintln!("qwen2.5-coder-0.5b: {accepted} of {drafted} drafts accepted");
    assert!(accepted > 0 && drafted > 0);
}

/// The cost of verifying k drafts on the CPU: one forward of 1 + k generation rows against one
/// of 1 row, after a warm-up that builds each shape's graph (`--ignored --nocapture`; figures
/// go to docs/PERFORMANCE.md, never asserted).
#[test]
#[ignore]
fn verify_cost_by_rows() {
    let Some(m) = minfer_testkit::models::qwen() else {
        return;
    };
    let mut engine = Engine::load(&m, EngineConfig::default()).unwrap();
    let prompt: Vec<u32> = (0..200).map(|i| 100 + i * 7).collect();
    for rows in [1usize, 2, 3, 5, 9] {
        let mut times = Vec::new();
        for rep in 0..6 {
            engine.kv_clear();
            engine.decode(&prompt, 0, 1).unwrap();
            let toks: Vec<u32> = (0..rows as u32).map(|i| 500 + i).collect();
            let t = std::time::Instant::now();
            engine.decode_generated(&toks, prompt.len(), rows).unwrap();
            if rep > 0 {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        times.sort_by(f64::total_cmp);
        eprintln!("rows {rows}: {:.2} ms (median of 5)", times[2]);
    }
}

/// A chat with lookup on SmolLM2 (issue 31: rejected rows never survive in the KV): three
/// code-edit turns give the plain chat's replies and KV tokens, and a session saved after the
/// speculative turns, resumed into a new speculating chat, carries on with the same reply and
/// the same next logits bit for bit. Control: drafts were accepted and rejected.
#[test]
fn a_chat_and_its_resumed_session_with_lookup_equal_plain_decoding() {
    use minfer_generate::chat::{Chat, ChatConfig};
    use std::sync::atomic::AtomicBool;
    let Some(m) = minfer_testkit::models::smol() else {
        return;
    };
    let cfg = |lookup| ChatConfig {
        sampler: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        max_tokens: 64,
        reply_reserve: 64,
        lookup,
        ..ChatConfig::default()
    };
    let open = |lookup| {
        let e = Engine::load(
            &m,
            EngineConfig {
                n_ctx: 2048,
                ..EngineConfig::default()
            },
        )
        .unwrap();
        Chat::new(e, cfg(lookup)).unwrap()
    };
    let on = Some(LookupConfig::default());
    let (mut plain, mut spec) = (open(None), open(on));
    let all = prompts();
    let (mut drafted, mut accepted) = (0, 0);
    let no = AtomicBool::new(false);
    for p in [&all[0], &all[7], &all[12]] {
        let a = plain.send(p, &no, |_| {}).unwrap();
        let b = spec.send(p, &no, |_| {}).unwrap();
        assert_eq!(a.reply, b.reply);
        assert_eq!(plain.kv_tokens(), spec.kv_tokens());
        let s = b.speculative.unwrap();
        drafted += s.drafted;
        accepted += s.accepted;
    }
    let file =
        std::env::temp_dir().join(format!("minfer-lookup-chat-{}.session", std::process::id()));
    spec.save(&file).unwrap();
    let mut resumed = open(on);
    resumed.load(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    assert_eq!(resumed.kv_tokens(), plain.kv_tokens());
    let last = "Now rename `acc` back and reply with the code only.";
    let a = plain.send(last, &no, |_| {}).unwrap();
    let c = resumed.send(last, &no, |_| {}).unwrap();
    assert_eq!(a.reply, c.reply);
    assert_eq!(a.prefilled, c.prefilled);
    let n = plain.kv_tokens().len();
    let la = plain.engine_mut().decode(&[5], n, 1).unwrap().to_vec();
    let lc = resumed.engine_mut().decode(&[5], n, 1).unwrap().to_vec();
    assert!(la.iter().zip(&lc).all(|(x, y)| x.to_bits() == y.to_bits()));
    eprintln!("smollm2 chat: {accepted} of {drafted} drafts accepted");
    assert!(
        accepted > 0 && drafted > accepted,
        "{accepted} of {drafted}"
    );
}
