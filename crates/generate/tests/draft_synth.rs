//! Model drafters on synthesized models (issue 31), on the CPU, wherever the tests run: greedy
//! output token for token plain decoding's on 20 prompts for a model drafting for itself
//! (every draft accepted), for a synthetic draft of the same vocabulary (almost every draft
//! rejected) and for self-drafting (the target's first blocks, on the CPU and on metal-emu,
//! where the draft runs on a sibling of the target's device backend and places no weight on
//! the device a second time); the vocabulary check refuses
//! a mismatch by its first difference; a chat with a draft keeps the plain chat's KV across
//! turns. Controls: drafts really ran (and were accepted or rejected as claimed), and the
//! refusals' controls pass. The real models' gates are in `draft_real.rs`.

use minfer_engine::{Engine, EngineConfig};
use minfer_generate::chat::{Chat, ChatConfig, Pieces};
use minfer_generate::draft::{check_vocab, DraftConfig, DraftHandle, EngineDraft};
use minfer_generate::sampler::SamplerConfig;
use minfer_generate::{generate, GenerateRequest};
use minfer_models::synth::{synthesize, SynthSpec};
use minfer_models::Arch;
use minfer_testkit::synth;
use minfer_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

const N_CTX: usize = 1024;

fn load(path: &Path) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx: N_CTX,
            threads: 1,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

fn draft_cfg() -> DraftConfig {
    DraftConfig {
        draft_max: 8,
        draft_min: 0,
        p_min: 0.0,
    }
}

fn handle(draft: Engine) -> DraftHandle {
    DraftHandle::new(EngineDraft::new(draft), draft_cfg())
}

/// A 4-block target (width 64, the built-in tokenizer).
fn target_file() -> PathBuf {
    synth::model(Arch::Qwen2, 4, 11)
}

fn request(prompt: Vec<u32>, eog: Vec<u32>, draft: Option<DraftHandle>) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens: 40,
        sampler: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        stop_strings: vec![],
        eog,
        logprobs: None,
        constraint: None,
        lookup: None,
        draft,
    }
}

/// Greedy replies to 20 prompts with and without the draft: asserts each is the same, and
/// returns (drafted, accepted, verifying forwards, tokens) over all of them.
fn compare(target: &mut Engine, draft: &DraftHandle) -> (usize, usize, usize, usize) {
    compare_n(target, draft, 20)
}

/// [`compare`] over the first `n` of its prompts.
fn compare_n(target: &mut Engine, draft: &DraftHandle, n: u32) -> (usize, usize, usize, usize) {
    let tok = Tokenizer::from_metadata(target.model().metadata()).unwrap();
    let vocab = target.hparams().vocab_size;
    let (mut drafted, mut accepted, mut forwards, mut tokens) = (0, 0, 0, 0);
    for i in 0..n {
        // Prompts of 5 to 43 tokens that repeat a piece (a reply may copy it).
        let piece = synth::tokens(3 + (i as usize % 7), 100 + i, vocab);
        let mut prompt = synth::tokens(2 + i as usize, i + 1, vocab);
        prompt.extend(&piece);
        prompt.extend(&piece);
        let eog = tok.eog_ids().to_vec();
        target.kv_clear();
        let plain = generate(
            target,
            &Pieces(&tok),
            &request(prompt.clone(), eog.clone(), None),
            |_| {},
        )
        .unwrap();
        target.kv_clear();
        let spec = generate(
            target,
            &Pieces(&tok),
            &request(prompt, eog, Some(draft.clone())),
            |_| {},
        )
        .unwrap();
        assert_eq!(plain.tokens, spec.tokens, "prompt {i}");
        assert_eq!(plain.text, spec.text, "prompt {i}");
        let s = spec.speculative.expect("the request speculated");
        drafted += s.drafted;
        accepted += s.accepted;
        forwards += s.verify_forwards;
        tokens += spec.tokens.len();
    }
    (drafted, accepted, forwards, tokens)
}

#[test]
fn a_model_drafting_for_itself_has_every_draft_accepted() {
    let f = target_file();
    let mut target = load(&f);
    let (d, a, v, n) = compare(&mut target, &handle(load(&f)));
    eprintln!("self as draft: {a} of {d} drafts accepted, {v} verifying forwards for {n} tokens");
    // Control: drafts ran; every one held (the draft computes the target's own rows).
    assert!(d > n / 2, "{d} drafts for {n} tokens");
    assert_eq!(a, d);
}

#[test]
fn a_synthetic_draft_of_the_same_vocabulary_is_rejected_and_changes_nothing() {
    let f = target_file();
    let other = synth::model(Arch::Qwen2, 1, 12345);
    let mut target = load(&f);
    check_vocab(target.model().metadata(), load(&other).model().metadata()).unwrap();
    let (d, a, v, n) = compare(&mut target, &handle(load(&other)));
    eprintln!("synthetic draft: {a} of {d} drafts accepted, {v} verifying forwards for {n} tokens");
    assert!(d > 0, "control: the draft ran");
    assert!(a * 2 < d, "{a} of {d}: the draft is not the target");
    // Adaptive length: after three misses drafting pauses (8, 16, … forwards).
    assert!(v * 3 < n, "{v} verifying forwards for {n} tokens");
}

#[test]
fn self_drafting_gives_plain_tokens_and_refuses_its_bounds() {
    let f = target_file();
    let mut target = load(&f);
    let cfg = EngineConfig {
        n_ctx: N_CTX,
        threads: 1,
        ..EngineConfig::default()
    };
    for bad in [0, 4, 9] {
        let e = target.self_draft(bad, cfg.clone()).err().expect("refused");
        assert!(e.to_string().contains("--self-draft"), "{e}");
        assert!(e.to_string().contains("1 to 3"), "{e}");
    }
    for layers in [1, 3] {
        let draft = target.self_draft(layers, cfg.clone()).unwrap();
        assert_eq!(draft.hparams().block_count, layers);
        let (d, a, v, n) = compare(&mut target, &handle(draft));
        eprintln!(
            "self-draft {layers} of 4 blocks: {a} of {d} drafts accepted, {v} verifying forwards for {n} tokens"
        );
        assert!(d > 0, "control: the draft ran");
    }
}

/// Self-drafting on a device backend (metal-emu: the Metal executor on the emulator): the
/// draft runs on a sibling of the target's backend (`Memory::sibling`), so making it places
/// no weight on the device (its device weight bytes are 0, the target's unchanged) while its
/// nodes run there, and greedy replies are plain decoding's for LAYERS 1 to 3. Controls:
/// drafts ran; a draft made the old way (backends of its own, `self_draft_copying`) places
/// the drafted weights on the device again.
#[test]
fn self_drafting_on_a_device_shares_the_weights_and_gives_plain_tokens() {
    let f = target_file();
    let cfg = EngineConfig {
        n_ctx: 256,
        threads: 1,
        backends: vec!["metal-emu".into()],
        ..EngineConfig::default()
    };
    let mut target = Engine::load(&f, cfg.clone()).unwrap();
    let weights = target.device_weights_bytes();
    assert!(
        weights > 0,
        "control: the target's weights are on the device"
    );
    for layers in [1, 2, 3] {
        let mut draft = target.self_draft(layers, cfg.clone()).unwrap();
        assert_eq!(draft.hparams().block_count, layers);
        assert_eq!(
            draft.n_ctx(),
            256,
            "the device's free memory holds the asked context"
        );
        assert_eq!(draft.device_weights_bytes(), 0, "self-draft {layers}");
        assert_eq!(target.device_weights_bytes(), weights);
        let nodes = draft.nodes_per_backend(1).unwrap();
        let on_device = nodes
            .iter()
            .find(|(b, _)| b == "metal-emu")
            .map_or(0, |n| n.1);
        assert!(on_device > 0, "the draft runs on the device: {nodes:?}");
        let (d, a, v, n) = compare_n(&mut target, &handle(draft), 6);
        eprintln!(
            "metal-emu self-draft {layers} of 4 blocks: {a} of {d} drafts accepted, {v} verifying forwards for {n} tokens"
        );
        assert!(d > 0, "control: the draft ran");
    }
    // Control: the old way uploads (wraps, converts) the drafted weights again.
    let mut copying = target.self_draft_copying(2, cfg.clone()).unwrap();
    assert!(
        copying.device_weights_bytes() > 0,
        "control: a draft on backends of its own holds its weights again"
    );
    // The sibling computes what a draft on backends of its own computes, bit for bit (the
    // shared weights are the right ones), and not the target's (control: another graph).
    let mut draft = target.self_draft(2, cfg.clone()).unwrap();
    let prompt = synth::tokens(9, 5, target.hparams().vocab_size);
    let bits = |e: &mut Engine| -> Vec<u32> {
        e.kv_clear();
        e.decode(&prompt, 0, 1)
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    let shared = bits(&mut draft);
    assert_eq!(shared, bits(&mut copying), "the sibling's logits");
    assert_ne!(
        shared,
        bits(&mut target),
        "control: the full model's differ"
    );
    // A device the target does not run on is refused by name (it would be a second upload).
    let cpu_target = load(&f);
    let e = cpu_target.self_draft(1, cfg).err().expect("refused");
    assert!(
        e.to_string().contains("metal-emu") && e.to_string().contains("second time"),
        "{e}"
    );
}

/// A self-draft on a device whose free memory (less the KV reserve) does not hold its KV at
/// the asked context takes the cells that fit, and still gives plain tokens (a longer
/// sequence would decode without drafts); under 64 cells it is refused by name with the
/// figures. The emulator's free memory is set (`MINFER_EMU_MEM`'s setting; it does not fall
/// as buffers are made): the target's KV, not yet allocated when the draft is made (so
/// promised to it), and 101 cells of the 2-block draft's f32 KV (512 bytes a cell) beside
/// the reserve. Control: once a forward has allocated the target's KV, the same device
/// holds the draft's whole context.
#[test]
fn a_self_draft_on_a_device_fits_its_context_into_the_free_memory() {
    use minfer_engine::backends::EmuMemory;
    use minfer_engine::kvsize::KV_RESERVE;
    let f = target_file();
    // The target's KV: 4 blocks of 2 KV heads of 16 f32s, K and V, N_CTX cells and scratch.
    let target_kv = 2 * 2 * 16 * 4 * 4 * (N_CTX as u64 + 1);
    let with_free = |cells: u64| {
        let mut cfg = EngineConfig {
            n_ctx: N_CTX,
            threads: 1,
            backends: vec!["metal-emu".into()],
            ..EngineConfig::default()
        };
        cfg.settings.emu.memory = EmuMemory::Bytes(KV_RESERVE + target_kv + cells * 512);
        cfg
    };
    let mut target = Engine::load(&f, with_free(101)).unwrap();
    assert_eq!(target.n_ctx(), N_CTX);
    assert_eq!(target.kv_plan().bytes, target_kv);
    let draft = target.self_draft(2, with_free(101)).unwrap();
    assert_eq!(
        draft.n_ctx(),
        100,
        "the cells that fit, less the scratch cell"
    );
    let (d, a, v, n) = compare_n(&mut target, &handle(draft), 4);
    eprintln!(
        "a 100-token self-draft: {a} of {d} drafts accepted, {v} verifying forwards for {n} tokens"
    );
    assert!(d > 0, "control: the draft ran");
    // Control: the target's KV is allocated now (it ran), so nothing more is promised.
    let whole = target.self_draft(2, with_free(101)).unwrap();
    assert_eq!(whole.n_ctx(), N_CTX);
    // The device is the target's: its free memory decides (the draft's own setting does not).
    let small = Engine::load(&f, with_free(30)).unwrap();
    let e = small.self_draft(2, with_free(101)).err().expect("refused");
    let e = e.to_string();
    assert!(
        e.contains("--self-draft on metal-emu") && e.contains("smaller context"),
        "{e}"
    );
}

#[test]
fn a_vocabulary_mismatch_is_refused_naming_the_first_difference() {
    let target = load(&target_file());
    let md = target.model().metadata();
    // Control: the same vocabulary (another model) passes.
    let same = load(&synth::model(Arch::Qwen2, 2, 99));
    assert_eq!(check_vocab(md, same.model().metadata()), Ok(()));
    // One token's text changed.
    let mut edited = md.clone();
    let mut texts: Vec<String> = md
        .get_strings("tokenizer.ggml.tokens")
        .unwrap()
        .iter()
        .map(str::to_string)
        .collect();
    texts[77] = "not-the-same".into();
    edited.set(
        "tokenizer.ggml.tokens",
        minfer_gguf::Value::Array(minfer_gguf::Array::String(texts.into())),
    );
    let e = check_vocab(md, &edited).unwrap_err();
    assert!(
        e.starts_with("token 77 is ") && e.contains("\"not-the-same\" in the draft"),
        "{e}"
    );
    // A vocabulary 300 tokens larger (a synthesized file padded past the slack).
    let n = target.hparams().vocab_size;
    let mut spec = SynthSpec::new(Arch::Qwen2, 1, 64, 4, 2, 128);
    spec.vocab_size = Some(n + 300);
    let p = synth::tmp("vocab-plus-300.gguf");
    std::fs::write(&p, synthesize(&spec).unwrap().to_bytes()).unwrap();
    let big = load(&p);
    let e = check_vocab(md, big.model().metadata()).unwrap_err();
    assert!(
        e.contains(&format!("{n} (target) and {} (draft)", n + 300)),
        "{e}"
    );
}

#[test]
fn a_chat_with_a_draft_keeps_the_plain_chats_kv_across_turns() {
    let f = target_file();
    let cfg = |draft| ChatConfig {
        sampler: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        max_tokens: 32,
        reply_reserve: 32,
        draft,
        ..ChatConfig::default()
    };
    let mut plain = Chat::new(load(&f), cfg(None)).unwrap();
    let wrong = synth::model(Arch::Qwen2, 1, 4242);
    for draft in [handle(load(&f)), handle(load(&wrong))] {
        let mut spec = Chat::new(load(&f), cfg(Some(draft))).unwrap();
        plain.clear();
        let no = AtomicBool::new(false);
        let (mut drafted, mut accepted) = (0, 0);
        for p in ["abc abc abc", "hello there, hello there", "xyz"] {
            let a = plain.send(p, &no, |_| {}).unwrap();
            let b = spec.send(p, &no, |_| {}).unwrap();
            assert_eq!(a.reply, b.reply);
            // No rejected row survives: the KV holds exactly the plain chat's tokens.
            assert_eq!(plain.kv_tokens(), spec.kv_tokens());
            assert_eq!(plain.engine().n_past(), spec.engine().n_past());
            let s = b.speculative.unwrap();
            drafted += s.drafted;
            accepted += s.accepted;
        }
        eprintln!("chat: {accepted} of {drafted} drafts accepted");
        assert!(drafted > 0, "control: the draft ran");
    }
}
