//! `minfer_eval` (perplexity, KL divergence) against independently computed values (issue 17).
//!
//! The oracle is the plain f64 reference forward (`minfer_models::reference`) run over each
//! chunk, with llama-perplexity's rules written out again here: chunks of n_ctx from an empty
//! cache, the second half scored. Tolerance: the engine's f32 forward differs from the f64
//! reference by ~1e-5 relative in the logits, so the PPLs agree to 1e-4 relative.

use minfer_eval::{kl_divergence, nll, perplexity, BaseLogits, LogitsWriter, PplConfig};
use minfer_gguf::GgmlType;
use minfer_models::Arch;
use minfer_testkit::{logits::reference_logits, synth};

fn ref_ppl(path: &std::path::Path, tokens: &[u32], n_ctx: usize, n_chunk: usize) -> (f64, usize) {
    let (mut sum, mut count) = (0.0f64, 0usize);
    for c in 0..n_chunk {
        let chunk = &tokens[c * n_ctx..(c + 1) * n_ctx];
        let rows = reference_logits(path, chunk);
        for pos in n_ctx / 2..n_ctx - 1 {
            let row = &rows[pos];
            let max = row.iter().cloned().fold(f64::MIN, f64::max);
            let lse = row.iter().map(|v| (v - max).exp()).sum::<f64>().ln() + max;
            sum += lse - row[chunk[pos + 1] as usize];
            count += 1;
        }
    }
    ((sum / count as f64).exp(), count)
}

#[test]
fn perplexity_matches_the_reference_forward_with_llama_chunking() {
    let path = synth::model(Arch::Qwen2, 2, 11);
    let tokens = synth::tokens(100, 5, 128);
    // 100 tokens in chunks of 32: 3 chunks (the last 4 tokens unused), 15 scored each; the
    // forward runs in batches of 8, so each chunk takes four forwards sharing its KV cache.
    let mut e = synth::engine(&path, 64, GgmlType::F32);
    let cfg = PplConfig {
        n_ctx: 32,
        n_batch: 8,
        n_chunks: None,
        bos: None,
    };
    let mut reports = vec![];
    let got = perplexity(&mut e, &tokens, &cfg, None, &mut |r| reports.push(r)).unwrap();
    let (want, count) = ref_ppl(&path, &tokens, 32, 3);
    assert_eq!((got.n_chunks, got.count, count), (3, 45, 45));
    assert!((got.ppl / want - 1.0).abs() < 1e-4, "{} vs {want}", got.ppl);
    assert_eq!(reports.len(), 3);
    assert_eq!(reports[2].ppl, got.ppl);
    // Control: scoring the first half too (another PPL) is far from this one.
    let (all, _) = {
        let rows = reference_logits(&path, &tokens[..32]);
        let s: f64 = (0..31)
            .map(|p| {
                let r: Vec<f32> = rows[p].iter().map(|&v| v as f32).collect();
                nll(&r, tokens[p + 1])
            })
            .sum();
        ((s / 31.0).exp(), 31)
    };
    let (first_chunk, _) = ref_ppl(&path, &tokens, 32, 1);
    assert!(
        (all / first_chunk - 1.0).abs() > 1e-3,
        "{all} vs {first_chunk}"
    );
}

/// A base saved by a model and compared with the same model gives KLD ~0 (the 16-bit
/// log-probability quantization alone) and the same top token everywhere; another model
/// (other weights) gives a clearly positive KLD. The base file round-trips its tokens.
#[test]
fn kl_divergence_is_zero_against_itself_and_positive_against_another_model() {
    let a = synth::model(Arch::Qwen2, 2, 21);
    let b = synth::model(Arch::Qwen2, 2, 22);
    let tokens = synth::tokens(96, 9, 128);
    let cfg = PplConfig {
        n_ctx: 32,
        n_batch: 32,
        n_chunks: Some(3),
        bos: None,
    };
    let base = synth::tmp("base.kld");
    let mut ea = synth::engine(&a, 64, GgmlType::F32);
    let mut w = LogitsWriter::create(&base).unwrap();
    let ppl = perplexity(&mut ea, &tokens, &cfg, Some(&mut w), &mut |_| {}).unwrap();
    let mut f = BaseLogits::open(&base).unwrap();
    let vocab = ea.hparams().vocab_size;
    assert_eq!((f.n_ctx(), f.n_vocab(), f.n_chunk()), (32, vocab, 3));
    assert_eq!(f.tokens(), &tokens[..96]);
    let same = kl_divergence(&mut ea, &mut f, 32, None, &mut |_, _| {}).unwrap();
    assert!(same.kld.value < 1e-5, "{:?}", same.kld);
    assert_eq!(same.same_top.value, 1.0);
    assert!((same.ppl.value / ppl.ppl - 1.0).abs() < 1e-6);
    assert!((same.ppl_base.value / ppl.ppl - 1.0).abs() < 1e-3);
    let mut eb = synth::engine(&b, 64, GgmlType::F32);
    let mut f = BaseLogits::open(&base).unwrap();
    let other = kl_divergence(&mut eb, &mut f, 32, None, &mut |_, _| {}).unwrap();
    assert!(other.kld.value > 1e-2, "{:?}", other.kld);
    assert!(other.same_top.value < 1.0);
}

#[test]
fn base_files_that_are_not_log_probabilities_are_refused() {
    let p = synth::tmp("bad.kld");
    std::fs::write(&p, b"_logitz_\0\0\0\0").unwrap();
    let err = BaseLogits::open(&p).err().unwrap().to_string();
    assert!(err.contains("no _logits_ magic"), "{err}");
    std::fs::write(&p, b"_logits_\x20\0\0\0\x80\0\0\0\x02\0\0\0").unwrap();
    let err = BaseLogits::open(&p).err().unwrap().to_string();
    assert!(err.contains("truncated token list"), "{err}");
}
