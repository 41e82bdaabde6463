//! Self-drafting on the CUDA backend (issue 31, ADR 0013): the draft engine runs on a sibling
//! of the target's CUDA backend (`Memory::sibling`: the same context, compiled kernels and
//! uploaded weights; its own stream, pool and KV), so making it uploads nothing, and greedy
//! replies with `--self-draft L` are plain decoding's on the GPU token for token, for L = 1,
//! 2 and 3 of 4 blocks. Prints SKIP and passes where no CUDA device exists; scripts/gpu-gate
//! builds it (`cargo test --release -p minfer-generate --features cuda --test
//! cuda_self_draft --no-run`) and runs it on the GPU machine.
//!
//! Controls: drafts ran (the replies count them); the target's weights are on the device
//! (its weight bytes, and the free memory they took); a draft made the old way, on a CUDA
//! backend of its own (`Engine::self_draft_copying`), uploads the drafted weights again and
//! the device's free memory drops by about as much, where the sibling's does not.

#![cfg(feature = "cuda")]

use minfer_engine::{Engine, EngineConfig};
use minfer_generate::chat::Pieces;
use minfer_generate::draft::{DraftConfig, DraftHandle, EngineDraft};
use minfer_generate::sampler::SamplerConfig;
use minfer_generate::{generate, GenerateRequest};
use minfer_gguf::GgmlType;
use minfer_models::synth::{synthesize, SynthSpec};
use minfer_models::Arch;
use minfer_testkit::synth;
use minfer_tokenizer::Tokenizer;
use std::path::PathBuf;

fn gpu() -> bool {
    match minfer_engine::backends::cuda_device_count() {
        Ok(n) if n > 0 => true,
        Ok(_) => {
            println!("SKIP: no CUDA device");
            false
        }
        Err(why) => {
            println!("SKIP: no CUDA device ({why})");
            false
        }
    }
}

/// 4 blocks of width 1024 in Q8_0 (the int8 kernels and the fused decode nodes), about
/// 13 MiB of weights a block: a block's upload is far above the driver's 2 MiB granularity
/// of free memory.
fn model_file() -> PathBuf {
    let mut spec = SynthSpec::new(Arch::Qwen2, 4, 1024, 16, 4, 2816);
    spec.weight_type = GgmlType::Q8_0;
    spec.seed = 31;
    let p = synth::tmp("cuda-self-draft.gguf");
    std::fs::write(&p, synthesize(&spec).unwrap().to_bytes()).unwrap();
    p
}

fn cfg() -> EngineConfig {
    EngineConfig {
        n_ctx: 512,
        threads: 2,
        cache_type: GgmlType::F16,
        backends: vec!["cuda".into()],
        ..EngineConfig::default()
    }
}

fn free(e: &Engine) -> usize {
    e.device_free_memory()
        .expect("a device backend")
        .expect("the device says its free memory")
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

#[test]
fn self_drafting_on_cuda_uploads_nothing_and_gives_plain_tokens() {
    if !gpu() {
        return;
    }
    let f = model_file();
    let mut target = Engine::load(&f, cfg()).unwrap();
    let weights = target.device_weights_bytes();
    assert!(
        weights > 40 << 20,
        "control: the weights are on the device ({weights})"
    );
    let tok = Tokenizer::from_metadata(target.model().metadata()).unwrap();
    let vocab = target.hparams().vocab_size;
    let eog = tok.eog_ids().to_vec();
    // About a block's weights: what a draft of L blocks would upload per block.
    let block = weights / 5;
    for layers in [1usize, 2, 3] {
        let before = free(&target);
        let mut draft = target.self_draft(layers, cfg()).unwrap();
        let after = free(&target);
        let took = before.saturating_sub(after);
        eprintln!("self-draft {layers}: free memory {before} -> {after} ({took} bytes)");
        assert_eq!(draft.device_weights_bytes(), 0, "self-draft {layers}");
        assert_eq!(target.device_weights_bytes(), weights);
        assert!(
            took < block / 2,
            "self-draft {layers}: making the draft took {took} bytes of the device (a block's weights are {block})"
        );
        let nodes = draft.nodes_per_backend(1).unwrap();
        assert!(
            nodes.iter().any(|(b, n)| b == "cuda" && *n > 0),
            "the draft runs on the GPU: {nodes:?}"
        );
        let handle = DraftHandle::new(
            EngineDraft::new(draft),
            DraftConfig {
                draft_max: 8,
                draft_min: 0,
                p_min: 0.0,
            },
        );
        let (mut drafted, mut accepted, mut tokens) = (0, 0, 0);
        for i in 0..12u32 {
            let piece = synth::tokens(3 + (i as usize % 7), 100 + i, vocab);
            let mut prompt = synth::tokens(2 + i as usize, i + 1, vocab);
            prompt.extend(&piece);
            prompt.extend(&piece);
            target.kv_clear();
            let plain = generate(
                &mut target,
                &Pieces(&tok),
                &request(prompt.clone(), eog.clone(), None),
                |_| {},
            )
            .unwrap();
            target.kv_clear();
            let spec = generate(
                &mut target,
                &Pieces(&tok),
                &request(prompt, eog.clone(), Some(handle.clone())),
                |_| {},
            )
            .unwrap();
            assert_eq!(plain.tokens, spec.tokens, "self-draft {layers}, prompt {i}");
            let s = spec.speculative.expect("the request speculated");
            drafted += s.drafted;
            accepted += s.accepted;
            tokens += spec.tokens.len();
        }
        eprintln!(
            "cuda self-draft {layers} of 4 blocks: {accepted} of {drafted} drafts accepted over {tokens} tokens"
        );
        assert!(drafted > 0, "control: the draft ran (self-draft {layers})");
    }
    // Control: a draft on a CUDA backend of its own uploads the drafted weights again.
    let before = free(&target);
    let copying = target.self_draft_copying(2, cfg()).unwrap();
    let took = before.saturating_sub(free(&target));
    eprintln!(
        "control: a draft of its own holds {} bytes of weights, free memory fell by {took}",
        copying.device_weights_bytes()
    );
    assert!(copying.device_weights_bytes() >= 2 * block);
    assert!(took >= block, "control: the old way took {took} bytes");
}
