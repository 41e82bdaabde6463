//! What the crate's unit tests over fake models share: a vocabulary of letters and a greedy
//! request.

use crate::sampler::SamplerConfig;
use crate::{GenerateRequest, TokenBytes};

/// Token `id` is the letter `'a' + id`.
pub(crate) struct Letters;

impl TokenBytes for Letters {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        vec![b'a' + id as u8]
    }
}

/// A greedy request for `n` tokens after `prompt`: no stops, no end-of-generation tokens.
pub(crate) fn greedy(prompt: Vec<u32>, n: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens: n,
        sampler: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        stop_strings: vec![],
        eog: vec![],
        logprobs: None,
        constraint: None,
        lookup: None,
    }
}
