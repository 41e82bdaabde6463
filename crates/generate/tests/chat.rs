//! The chat on synthetic models: each turn prefills only its own tokens, old turns are
//! dropped by shifting the KV, a too-long message changes nothing, /regen, interrupts and
//! resumed sessions.

use minfer_generate::chat::{Chat, ChatConfig, ChatError, Resumed, TurnEnd, TurnReport};
use minfer_generate::sampler::SamplerConfig;
use minfer_generate::FinishReason;
use minfer_gguf::GgmlType;
use minfer_models::Arch;
use minfer_testkit::synth::*;
use minfer_tokenizer::template::{ChatTemplate, Message, RenderOptions};
use minfer_tokenizer::TokenType;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

fn config(max_tokens: usize, temperature: f32) -> ChatConfig {
    ChatConfig {
        sampler: SamplerConfig {
            temperature,
            seed: 42,
            ..SamplerConfig::default()
        },
        max_tokens,
        stop: vec![],
        reply_reserve: max_tokens,
        constraint: None,
        lookup: None,
        draft: None,
    }
}

/// A chat whose replies avoid tokens that are not whole UTF-8 text and control tokens other
/// than end-of-generation (random weights would otherwise emit them, and the reply text kept
/// in the history would not be the text of the tokens in the KV).
fn chat(path: &Path, n_ctx: usize, ty: GgmlType, cfg: ChatConfig) -> Chat {
    let mut c = Chat::new(engine(path, n_ctx, ty), cfg).unwrap();
    let tok = c.tokenizer();
    let banned: Vec<(u32, f32)> = (0..tok.n_vocab() as u32)
        .filter(|&id| {
            let ok_text = std::str::from_utf8(tok.piece(id).unwrap_or(&[0xFF])).is_ok();
            let control = matches!(tok.token_type(id), Ok(TokenType::Control));
            (control && !tok.is_eog(id)) || (!control && !ok_text)
        })
        .map(|id| (id, f32::NEG_INFINITY))
        .collect();
    c.config_mut().sampler.logit_bias = banned;
    c
}

fn template(c: &Chat) -> ChatTemplate {
    ChatTemplate::from_metadata(c.engine().model().metadata())
        .unwrap()
        .template
}

fn render(t: &ChatTemplate, m: &[Message], gen: bool) -> String {
    t.render(
        m,
        &RenderOptions {
            add_generation_prompt: gen,
            ..RenderOptions::default()
        },
    )
    .unwrap()
}

/// The KV holds exactly the rendering of the conversation.
fn assert_in_sync(c: &Chat) {
    let t = template(c);
    let text = c.tokenizer().decode(c.kv_tokens()).unwrap();
    assert_eq!(
        String::from_utf8(text).unwrap(),
        render(&t, c.messages(), false)
    );
    assert_eq!(c.engine().n_past(), c.kv_tokens().len());
}

/// A turn's own new tokens, computed from the template and the tokenizer: the text the
/// user message adds (header, message, assistant header), the reply's closing text, and
/// the reply's last sampled token, which generation never decodes (unless it is the
/// end-of-generation token, which the closing text stands for).
fn own_tokens(c: &Chat, before: &[Message], user: &str, r: &TurnReport) -> usize {
    let t = template(c);
    let tok = c.tokenizer();
    let mut with_user = before.to_vec();
    with_user.push(Message::user(user));
    // Before the first turn the KV is empty, even of the system message.
    let old = if before.iter().any(|m| m.role == "user") {
        render(&t, before, false)
    } else {
        String::new()
    };
    let prompt = render(&t, &with_user, true);
    with_user.push(Message::assistant(r.reply.as_str()));
    let after = render(&t, &with_user, false);
    let closing = &after[prompt.len() + r.reply.len()..];
    let last = usize::from(r.end != TurnEnd::Finished(FinishReason::Eos) && r.generated > 0);
    tok.encode(&prompt[old.len()..], true).len() + tok.encode(closing, true).len() + last
}

const WORDS: [&str; 10] = [
    "the weather",
    "a recipe",
    "the river",
    "Hello there",
    "a poem",
    "the stars",
    "an engine",
    "the sea",
    "a garden",
    "the city",
];

#[test]
fn ten_turns_prefill_only_their_own_tokens() {
    let path = model(Arch::Qwen2, 2, 21);
    let mut c = chat(&path, 1024, GgmlType::F32, config(8, 0.0));
    c.set_system(Some("You are helpful."));
    let mut total_prefilled = 0;
    let mut total_fed_generated = 0;
    eprintln!("turn | own new tokens | prefilled | generated | KV after");
    for (i, w) in WORDS.iter().enumerate() {
        let user = format!("Question {i}: tell me about {w}, please.");
        let before = c.messages().to_vec();
        let r = c.send(&user, &AtomicBool::new(false), |_| {}).unwrap();
        let own = own_tokens(&c, &before, &user, &r);
        eprintln!(
            "{:>4} | {own:>14} | {:>9} | {:>9} | {:>8}",
            i + 1,
            r.prefilled,
            r.generated,
            c.kv_tokens().len()
        );
        assert!(
            r.prefilled.abs_diff(own) * 20 <= own,
            "turn {}: prefilled {} vs own {own}",
            i + 1,
            r.prefilled
        );
        assert_eq!(r.dropped_turns, 0);
        assert_in_sync(&c);
        total_prefilled += r.prefilled;
        // Every sampled token but the last is decoded while generating.
        total_fed_generated += r.generated - 1;
    }
    // Nothing in the history was prefilled twice.
    assert_eq!(total_prefilled + total_fed_generated, c.kv_tokens().len());
}

/// Control for the gate above: a chat that re-prefills its history each turn (what a
/// stateless one would do) is caught by the 5% bound from the second turn on.
#[test]
fn control_reprefilling_the_history_breaks_the_bound() {
    let path = model(Arch::Qwen2, 1, 22);
    let mut c = chat(&path, 512, GgmlType::F32, config(4, 0.0));
    c.send("first question", &AtomicBool::new(false), |_| {})
        .unwrap();
    let before = c.messages().to_vec();
    let r = c
        .send("second question", &AtomicBool::new(false), |_| {})
        .unwrap();
    let own = own_tokens(&c, &before, "second question", &r);
    let mut all = before.clone();
    all.push(Message::user("second question"));
    let stateless = c
        .tokenizer()
        .encode(&render(&template(&c), &all, true), true)
        .len()
        + r.closing_tokens;
    assert!(r.prefilled.abs_diff(own) * 20 <= own);
    assert!(stateless.abs_diff(own) * 20 > own, "{stateless} vs {own}");
}

#[test]
fn a_full_context_drops_the_oldest_turns_by_shifting() {
    let path = model(Arch::Qwen2, 2, 23);
    let mut c = chat(&path, 160, GgmlType::F32, config(8, 0.0));
    c.set_system(Some("Be brief."));
    let mut dropped = 0;
    for (i, w) in WORDS.iter().enumerate() {
        let user = format!("Turn {i} about {w}");
        let before = c.messages().to_vec();
        let r = c.send(&user, &AtomicBool::new(false), |_| {}).unwrap();
        assert_in_sync(&c);
        assert!(c.kv_tokens().len() <= 160);
        assert_eq!(c.messages()[0], Message::system("Be brief."));
        if r.dropped_turns > 0 {
            dropped += r.dropped_turns;
            assert!(
                r.notices.iter().any(|n| n.contains("shifted back")),
                "{:?}",
                r.notices
            );
            // The history left after the drop is not prefilled again.
            let mut kept = before.clone();
            kept.drain(1..1 + 2 * r.dropped_turns);
            let own = own_tokens(&c, &kept, &user, &r);
            assert!(
                r.prefilled.abs_diff(own) * 20 <= own,
                "{} vs {own}",
                r.prefilled
            );
        }
    }
    assert!(dropped >= 2, "only {dropped} turns dropped");
    assert!(c.messages().len() < 2 * WORDS.len() + 1);
}

#[test]
fn a_kv_that_cannot_shift_re_renders_with_a_notice() {
    let path = model_heads(Arch::Qwen2, 1, 24, 2, 1);
    let mut c = chat(&path, 128, GgmlType::Q8_0, config(8, 0.0));
    let mut notices = Vec::new();
    for (i, w) in WORDS.iter().enumerate() {
        let r = c
            .send(
                &format!("Turn {i} about {w}"),
                &AtomicBool::new(false),
                |_| {},
            )
            .unwrap();
        assert_in_sync(&c);
        notices.extend(r.notices);
    }
    assert!(
        notices.iter().any(|n| n.contains("cannot shift")),
        "{notices:?}"
    );
}

#[test]
fn a_message_that_cannot_fit_is_refused_and_changes_nothing() {
    let path = model(Arch::Qwen2, 1, 25);
    let mut c = chat(&path, 64, GgmlType::F32, config(4, 0.0));
    c.send("hi", &AtomicBool::new(false), |_| {}).unwrap();
    let (messages, kv) = (c.messages().to_vec(), c.kv_tokens().to_vec());
    let long = "word ".repeat(100);
    let err = c.send(&long, &AtomicBool::new(false), |_| {}).unwrap_err();
    assert!(
        matches!(err, ChatError::MessageTooLong { n_ctx: 64, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("nothing was changed"));
    assert_eq!(c.messages(), &messages[..]);
    assert_eq!(c.kv_tokens(), &kv[..]);
    assert_in_sync(&c);
}

#[test]
fn regen_replaces_the_last_reply_and_prefills_one_token() {
    let path = model(Arch::Llama, 2, 26);
    let mut c = chat(&path, 512, GgmlType::F32, config(6, 0.9));
    c.send("first", &AtomicBool::new(false), |_| {}).unwrap();
    c.send("second", &AtomicBool::new(false), |_| {}).unwrap();
    let n = c.messages().len();
    let r = c.regen(&AtomicBool::new(false), |_| {}).unwrap();
    assert_eq!(c.messages().len(), n);
    assert_eq!(c.messages()[n - 2], Message::user("second"));
    assert_eq!(
        c.messages()[n - 1].content.as_deref(),
        Some(r.reply.as_str())
    );
    // The prompt is already in the KV: only its last token is decoded again for logits.
    assert_eq!(r.prompt_tokens, 1);
    assert_in_sync(&c);
    let mut fresh = chat(&path, 512, GgmlType::F32, config(6, 0.9));
    assert!(matches!(
        fresh.regen(&AtomicBool::new(false), |_| {}),
        Err(ChatError::NothingToRegenerate)
    ));
}

#[test]
fn an_interrupted_reply_is_kept_and_the_chat_goes_on() {
    let path = model(Arch::Qwen2, 1, 27);
    let mut c = chat(&path, 512, GgmlType::F32, config(50, 0.0));
    let cancel = AtomicBool::new(false);
    let r = c
        .send("tell me a long story", &cancel, |_| {
            cancel.store(true, Ordering::Relaxed)
        })
        .unwrap();
    assert_eq!(r.end, TurnEnd::Interrupted);
    assert!(r.generated < 50);
    assert_in_sync(&c);
    let r = c.send("go on", &AtomicBool::new(false), |_| {}).unwrap();
    assert_ne!(r.end, TurnEnd::Interrupted);
    assert_in_sync(&c);
}

/// Save after two turns, resume in a new engine: the third turn prefills the same tokens
/// and the reply (sampled, not greedy) and the next logits are bit-identical.
#[test]
fn a_resumed_chat_continues_bit_identically() {
    let path = model(Arch::Qwen2, 2, 28);
    let file = tmp("chat.session");
    let mut a = chat(&path, 256, GgmlType::F16, config(6, 0.8));
    a.set_system(Some("sys"));
    a.send("one", &AtomicBool::new(false), |_| {}).unwrap();
    a.send("two", &AtomicBool::new(false), |_| {}).unwrap();
    a.save(&file).unwrap();
    let ra = a.send("three", &AtomicBool::new(false), |_| {}).unwrap();

    let mut b = chat(&path, 256, GgmlType::F16, config(6, 0.8));
    b.load(&file).unwrap();
    assert_eq!(b.engine().n_past(), b.kv_tokens().len());
    assert_in_sync(&b);
    let rb = b.send("three", &AtomicBool::new(false), |_| {}).unwrap();
    assert_eq!(ra.reply, rb.reply);
    assert_eq!(ra.prefilled, rb.prefilled);
    assert_eq!(a.kv_tokens(), b.kv_tokens());
    assert_eq!(a.messages(), b.messages());
    let n = a.kv_tokens().len();
    let la = a.engine_mut().decode(&[5], n, 1).unwrap().to_vec();
    let lb = b.engine_mut().decode(&[5], n, 1).unwrap().to_vec();
    assert!(la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()));

    // A session of another n_ctx gives back its messages without its KV (issue 18): the
    // next turn prefills the whole conversation, whose rendering the KV then holds.
    let mut other = chat(&path, 128, GgmlType::F16, config(6, 0.8));
    match other.load(&file).unwrap() {
        Resumed::Messages { why } => assert!(why.to_string().contains("n_ctx 256"), "{why}"),
        r => panic!("the KV of another n_ctx was reused: {r:?}"),
    }
    assert_eq!(other.messages().len(), 5);
    assert!(other.kv_tokens().is_empty() && other.engine().n_past() == 0);
    let r = other
        .send("three", &AtomicBool::new(false), |_| {})
        .unwrap();
    assert!(
        r.prefilled > ra.prefilled,
        "{} vs {}",
        r.prefilled,
        ra.prefilled
    );
    assert_in_sync(&other);
    // A corrupt file is refused whole and the chat is unchanged.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[60] ^= 1;
    let bad = tmp("corrupt.session");
    std::fs::write(&bad, &bytes).unwrap();
    let mut fresh = chat(&path, 128, GgmlType::F16, config(6, 0.8));
    let err = fresh.load(&bad).unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
    assert!(fresh.messages().is_empty() && fresh.kv_tokens().is_empty());
}

/// Prompt lookup across turns (issue 31): every reply, the KV's tokens and the next logits
/// are plain decoding's, and a session saved after a speculative turn resumes identically
/// into another speculating chat. A rejected draft's row left in the KV would sit at a
/// position a later turn writes again and change its logits; the probe decodes at the end
/// compare them bit for bit. Control: drafts were both accepted and rejected (else the
/// truncation never ran), in every chat that speculated.
#[test]
fn lookup_across_turns_and_a_resumed_session_is_plain_decoding() {
    use minfer_generate::lookup::LookupConfig;
    let path = model(Arch::Qwen2, 2, 31);
    let file = tmp("lookup.session");
    let spec_cfg = || {
        let mut c = config(24, 0.0);
        c.lookup = Some(LookupConfig {
            ngram: 2,
            draft_max: 8,
        });
        c
    };
    let mut plain = chat(&path, 512, GgmlType::F16, config(24, 0.0));
    let mut spec = chat(&path, 512, GgmlType::F16, spec_cfg());
    plain.set_system(Some("sys"));
    spec.set_system(Some("sys"));
    let (mut drafted, mut accepted) = (0, 0);
    let mut tally = |r: &TurnReport| {
        let s = r
            .speculative
            .expect("a speculating turn reports its drafts");
        drafted += s.drafted;
        accepted += s.accepted;
    };
    let turns = ["the river the river", WORDS[1], WORDS[4], WORDS[7]];
    for (i, w) in turns.iter().enumerate() {
        let a = plain.send(w, &AtomicBool::new(false), |_| {}).unwrap();
        let b = spec.send(w, &AtomicBool::new(false), |_| {}).unwrap();
        assert!(a.speculative.is_none());
        assert_eq!(a.reply, b.reply, "turn {i}");
        assert_eq!((a.generated, a.prefilled), (b.generated, b.prefilled));
        assert_eq!(plain.kv_tokens(), spec.kv_tokens(), "turn {i}");
        assert_eq!(spec.engine().n_past(), spec.kv_tokens().len());
        assert_in_sync(&spec);
        tally(&b);
    }
    spec.save(&file).unwrap();
    // Resumed into a new speculating chat, and carried on in the old one and the plain one.
    let mut resumed = chat(&path, 512, GgmlType::F16, spec_cfg());
    resumed.load(&file).unwrap();
    assert_eq!(resumed.kv_tokens(), plain.kv_tokens());
    for w in [WORDS[2], WORDS[8]] {
        let a = plain.send(w, &AtomicBool::new(false), |_| {}).unwrap();
        let b = spec.send(w, &AtomicBool::new(false), |_| {}).unwrap();
        let c = resumed.send(w, &AtomicBool::new(false), |_| {}).unwrap();
        assert_eq!(a.reply, b.reply);
        assert_eq!(a.reply, c.reply);
        assert_eq!(
            a.prefilled, c.prefilled,
            "the resumed chat prefilled the same tokens"
        );
        assert_eq!(plain.kv_tokens(), resumed.kv_tokens());
        tally(&b);
        tally(&c);
    }
    let n = plain.kv_tokens().len();
    let probe = |c: &mut Chat| c.engine_mut().decode(&[5], n, 1).unwrap().to_vec();
    let lp = probe(&mut plain);
    for (name, c) in [("speculating", &mut spec), ("resumed", &mut resumed)] {
        let l = probe(c);
        assert!(
            lp.iter().zip(&l).all(|(x, y)| x.to_bits() == y.to_bits()),
            "the {name} chat's KV differs from plain decoding's"
        );
    }
    eprintln!("lookup: {accepted} of {drafted} drafts accepted");
    assert!(
        accepted > 0 && drafted > accepted,
        "{accepted} of {drafted} drafts accepted: both kinds are needed"
    );
}
