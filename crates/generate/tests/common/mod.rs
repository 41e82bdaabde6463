//! What the real-model gates share.

pub mod code_edits;

use minfer_generate::sampler::SamplerConfig;
use minfer_generate::GenerateRequest;
use minfer_tokenizer::Tokenizer;

/// The chat-rendered `text` as a greedy request of `max_tokens`, stopping at the tokenizer's
/// end-of-generation ids, with no drafter (the gates set `lookup` or `draft` on a copy).
pub fn greedy_request(tok: &Tokenizer, text: &str, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: tok.encode(text, true),
        max_tokens,
        sampler: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        stop_strings: vec![],
        eog: tok.eog_ids().to_vec(),
        logprobs: None,
        constraint: None,
        lookup: None,
        draft: None,
    }
}
