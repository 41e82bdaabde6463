//! Batch invariance, bitwise, on the CPU (native numerics), for f32, f16 and q8_0 KV: a
//! sequence's logits are the same alone and in any batch — any other sequences, any number of
//! them (1–16), any order, any bucket padding, any prefill chunk size (1, 7, 64, 512).
//!
//! The property test draws random batch compositions; the reference is the sequence run
//! alone, prefilled in one forward, in a fresh engine (so it sits at other cells and in other
//! graph shapes: asserted, so the two sides really ran differently). Controls: a CPU backend
//! that picks the f16 attention arithmetic by the forward's row count (what the kernels did
//! before) fails it, and so does a composition that really changes the sequence (another
//! token).

use minfer_engine::{BatchEntry, Engine, EngineConfig, Error, SeqId};
use minfer_gguf::GgmlType;
use minfer_models::Arch;
use minfer_testkit::rng::Rng;
use minfer_testkit::synth::*;

fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

thread_local! {
    /// The CPU arithmetic the harness loads engines with (the control switches it).
    static NUMERICS: std::cell::Cell<minfer_cpu::Numerics> =
        const { std::cell::Cell::new(minfer_cpu::Numerics::Native) };
}

fn engine_with(path: &std::path::PathBuf, ty: GgmlType, n_batch: usize) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx: 1024,
            threads: 2,
            cache_type: ty,
            n_batch,
            ..EngineConfig::default()
        }
        .with_numerics(NUMERICS.with(|n| n.get())),
    )
    .unwrap()
}

/// The target's logits after its prompt and after each of its probe tokens, alone.
fn alone(path: &std::path::PathBuf, ty: GgmlType, prompt: &[u32], probes: &[u32]) -> Vec<Vec<f32>> {
    let mut e = engine_with(path, ty, 1024);
    let mut out = vec![e.decode(prompt, 0, 1).unwrap().to_vec()];
    for (i, &t) in probes.iter().enumerate() {
        out.push(e.decode(&[t], prompt.len() + i, 1).unwrap().to_vec());
    }
    out
}

/// Runs the target inside random company: other sequences (some sharing a prefix with each
/// other), random order, the target's prompt in chunks of `chunk`, then its probes one per
/// forward among other sequences' decode tokens or prompt chunks. Returns the target's
/// logits at the same points as [`alone`].
fn in_company(
    path: &std::path::PathBuf,
    ty: GgmlType,
    prompt: &[u32],
    probes: &[u32],
    chunk: usize,
    rng: &mut Rng,
) -> (Vec<Vec<f32>>, Vec<minfer_engine::Run>) {
    let mut e = engine_with(path, ty, 1024);
    let vocab = e.hparams().vocab_size;
    let n_others = 1 + rng.below(15);
    // Others: (seq, their tokens, how many fed so far).
    let mut others: Vec<(SeqId, Vec<u32>, usize)> = (0..n_others)
        .map(|k| {
            let len = 1 + rng.below(90);
            (
                e.seq_create(),
                tokens(len, 100 + k as u32 + rng.below(1000) as u32, vocab),
                0,
            )
        })
        .collect();
    // A little history first, so the target lands on scattered cells.
    for o in others.iter_mut().take(3) {
        let n = o.1.len().min(5);
        e.forward_batch(&[BatchEntry {
            seq: o.0,
            tokens: &o.1[..n],
            pos0: 0,
            logits: 0,
            class: minfer_engine::RowClass::Prompt,
        }])
        .unwrap();
        o.2 = n;
    }
    if n_others > 1 {
        let src = others[0].0;
        let dst = others[1].0;
        let n = others[0].2;
        e.seq_share_prefix(dst, src, n).unwrap();
        others[1].1 = others[0].1.clone();
        others[1].2 = n;
    }
    let target = e.seq_create();
    let mut got = Vec::new();
    let mut fed = 0;
    let mut step = 0;
    let budget_left =
        |entries: &Vec<BatchEntry>| 1024 - entries.iter().map(|x| x.tokens.len()).sum::<usize>();
    loop {
        let done = fed == prompt.len() + probes.len();
        if done {
            break;
        }
        let mine: Vec<u32>;
        let mine_pos0;
        let mine_logits;
        if fed < prompt.len() {
            let n = chunk.min(prompt.len() - fed);
            mine = prompt[fed..fed + n].to_vec();
            mine_pos0 = fed;
            mine_logits = usize::from(fed + n == prompt.len());
        } else {
            let i = fed - prompt.len();
            mine = vec![probes[i]];
            mine_pos0 = fed;
            mine_logits = 1;
        }
        let mut entries: Vec<BatchEntry> = Vec::new();
        let mut slot_of_target = 0;
        let order: Vec<usize> = {
            let mut o: Vec<usize> = (0..others.len()).collect();
            for i in (1..o.len()).rev() {
                o.swap(i, rng.below(i + 1));
            }
            o
        };
        let insert_at = rng.below(order.len() + 1);
        let mut chosen = Vec::new();
        for (j, &k) in order.iter().enumerate() {
            if j == insert_at {
                slot_of_target = entries.len();
                entries.push(BatchEntry {
                    seq: target,
                    tokens: &mine,
                    pos0: mine_pos0,
                    logits: mine_logits,
                    class: minfer_engine::RowClass::Prompt,
                });
            }
            let o = &others[k];
            if o.2 >= o.1.len() || rng.below(3) == 0 {
                continue;
            }
            let room = budget_left(&entries);
            let n = (1 + rng.below(17)).min(o.1.len() - o.2).min(room);
            if n == 0 {
                continue;
            }
            entries.push(BatchEntry {
                seq: o.0,
                tokens: &o.1[o.2..o.2 + n],
                pos0: o.2,
                logits: rng.below(n + 1),
                class: minfer_engine::RowClass::Prompt,
            });
            chosen.push((k, n));
        }
        if insert_at == order.len() {
            slot_of_target = entries.len();
            entries.push(BatchEntry {
                seq: target,
                tokens: &mine,
                pos0: mine_pos0,
                logits: mine_logits,
                class: minfer_engine::RowClass::Prompt,
            });
        }
        let out = e.forward_batch(&entries).unwrap();
        if mine_logits == 1 {
            got.push(out.logits(slot_of_target).to_vec());
        }
        for (k, n) in chosen {
            others[k].2 += n;
        }
        fed += mine.len();
        step += 1;
        // Now and then an other sequence leaves and its cells are reused.
        if step % 3 == 0 && !others.is_empty() {
            let k = rng.below(others.len());
            let (s, _, _) = others.remove(k);
            e.seq_release(s).unwrap();
        }
    }
    e.cells().check().unwrap();
    (got, e.cells().runs(target).unwrap().to_vec())
}

#[test]
fn a_sequence_gives_the_same_bits_alone_and_in_any_batch() {
    let path = model_heads(Arch::Qwen2, 2, 31, 2, 1);
    let mut rng = Rng::splitmix64(0x5eed);
    let mut cases = 0;
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
        for &chunk in &[1usize, 7, 64, 512] {
            for _ in 0..3 {
                let vocab = 128;
                let plen = 1 + rng.below(150);
                let prompt = tokens(plen, rng.below(10_000) as u32, vocab);
                let probes = tokens(3, rng.below(10_000) as u32, vocab);
                let want = alone(&path, ty, &prompt, &probes);
                let (got, runs) = in_company(&path, ty, &prompt, &probes, chunk, &mut rng);
                assert_eq!(got.len(), want.len());
                for (step, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        bits_eq(g, w),
                        "{ty} chunk {chunk} prompt {plen} step {step}: batch changed the bits \
                         (runs {runs:?})"
                    );
                }
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 36);
}

/// The property with the demo model's attention shape (14 heads, 2 KV heads of 64: the f16
/// prompt rows run by tiles of up to 16 rows, `attn_f16::attend_tile_on`, whose make-up
/// depends on what shares the forward and on the chunking), f16 KV: a sequence's logits are
/// the same alone and in any batch, at every chunk size.
#[test]
fn a_sequence_gives_the_same_bits_alone_and_in_any_batch_with_heads_of_64() {
    let path = heads_of_64();
    let mut rng = Rng::splitmix64(0x64);
    let mut cases = 0;
    for &chunk in &[1usize, 7, 16, 64, 512] {
        for _ in 0..3 {
            let plen = 1 + rng.below(150);
            let prompt = tokens(plen, rng.below(10_000) as u32, 128);
            let probes = tokens(3, rng.below(10_000) as u32, 128);
            let want = alone(&path, GgmlType::F16, &prompt, &probes);
            let (got, runs) = in_company(&path, GgmlType::F16, &prompt, &probes, chunk, &mut rng);
            assert_eq!(got.len(), want.len());
            for (step, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    bits_eq(g, w),
                    "chunk {chunk} prompt {plen} step {step}: batch changed the bits \
                     (runs {runs:?})"
                );
            }
            cases += 1;
        }
    }
    assert_eq!(cases, 15);
}

/// A two-layer Qwen2 of width 896 with 14 heads and 2 KV heads (heads of 64, as the demo).
fn heads_of_64() -> std::path::PathBuf {
    let mut spec = minfer_models::synth::SynthSpec::new(Arch::Qwen2, 2, 896, 14, 2, 256);
    spec.seed = 64;
    let path = tmp("heads-of-64.gguf");
    std::fs::write(
        &path,
        minfer_models::synth::synthesize(&spec).unwrap().to_bytes(),
    )
    .unwrap();
    path
}

/// Control for the property's harness: an arithmetic that picks its kernels by the forward's
/// row count (llama.cpp's, which switches its f16 attention at 64 query rows and its tiled
/// matmuls at 8) must fail it: some target row differs between alone and in company. The
/// engine runs such a backend at exact shapes, so only the company changes the row count.
#[test]
fn control_a_row_count_dependent_arithmetic_fails_the_property() {
    let mut spec = minfer_models::synth::SynthSpec::new(Arch::Qwen2, 2, 64, 2, 1, 128);
    spec.weight_type = GgmlType::Q8_0;
    spec.seed = 33;
    let path = tmp("q8-control.gguf");
    std::fs::write(
        &path,
        minfer_models::synth::synthesize(&spec).unwrap().to_bytes(),
    )
    .unwrap();
    let llama = minfer_cpu::Numerics::parse("llamacpp-x86-avx2").unwrap();
    let mut rng = Rng::splitmix64(0xc0);
    let mut differs = 0;
    for _ in 0..6 {
        let prompt = tokens(1 + rng.below(40), rng.below(10_000) as u32, 128);
        let probes = tokens(3, rng.below(10_000) as u32, 128);
        NUMERICS.with(|n| n.set(llama));
        let want = alone(&path, GgmlType::F16, &prompt, &probes);
        let (got, _) = in_company(&path, GgmlType::F16, &prompt, &probes, 7, &mut rng);
        NUMERICS.with(|n| n.set(minfer_cpu::Numerics::Native));
        differs += got
            .iter()
            .zip(&want)
            .filter(|(g, w)| !bits_eq(g, w))
            .count();
    }
    assert!(
        differs > 0,
        "the control arithmetic passed the invariance property"
    );
}

/// Control for the property: changing the sequence itself (one prompt token) changes its
/// logits, so equal bits are not an accident of an insensitive probe.
#[test]
fn control_a_different_token_changes_the_bits() {
    let path = model_heads(Arch::Qwen2, 2, 31, 2, 1);
    let prompt = tokens(20, 5, 128);
    let mut other = prompt.clone();
    other[3] = (other[3] + 1) % 128;
    let probes = tokens(1, 6, 128);
    let a = alone(&path, GgmlType::F16, &prompt, &probes);
    let b = alone(&path, GgmlType::F16, &other, &probes);
    assert!(!bits_eq(&a[1], &b[1]));
}

/// Refused batch entries name what is wrong and change nothing: the cell table and every
/// other sequence's next logits are as before the refused call.
#[test]
fn bad_entries_are_typed_errors_and_change_nothing() {
    let path = model_heads(Arch::Qwen2, 2, 32, 2, 1);
    let mut e = Engine::load(
        &path,
        EngineConfig {
            n_ctx: 64,
            threads: 1,
            cache_type: GgmlType::F16,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let vocab = e.hparams().vocab_size;
    let (a, b) = (e.seq_create(), e.seq_create());
    let (ta, tb) = (tokens(10, 1, vocab), tokens(12, 2, vocab));
    e.forward_batch(&[BatchEntry::new(a, &ta, 0), BatchEntry::new(b, &tb, 0)])
        .unwrap();
    let probe = [3u32];
    let next = |e: &mut Engine| -> (Vec<f32>, Vec<f32>) {
        let snapshot = e.cells().clone();
        let pa = e
            .forward_batch(&[BatchEntry::new(a, &probe, 10)])
            .unwrap()
            .logits(0)
            .to_vec();
        let pb = e
            .forward_batch(&[BatchEntry::new(b, &probe, 12)])
            .unwrap()
            .logits(0)
            .to_vec();
        // Undo the probes so the state is as it was.
        e.seq_truncate(a, 10).unwrap();
        e.seq_truncate(b, 12).unwrap();
        assert_eq!(e.cells().n_free(), snapshot.n_free());
        (pa, pb)
    };
    let before_cells = e.cells().clone();
    let before = next(&mut e);
    let unknown = SeqId(999);
    let big = tokens(60, 3, vocab);
    let outside = [vocab as u32 + 5];
    let bad: Vec<(Vec<BatchEntry>, &str)> = vec![
        (
            vec![
                BatchEntry::new(a, &probe, 10),
                BatchEntry::new(unknown, &probe, 0),
            ],
            "999",
        ),
        (
            vec![
                BatchEntry::new(a, &probe, 10),
                BatchEntry::new(b, &probe, 14),
            ],
            "position",
        ),
        (vec![BatchEntry::new(b, &outside, 12)], "vocabulary"),
        (
            vec![BatchEntry::new(a, &probe, 10), BatchEntry::new(b, &big, 12)],
            "n_ctx",
        ),
        (vec![BatchEntry::new(a, &big[..50], 10)], "arena"),
        (
            vec![
                BatchEntry::new(a, &probe, 10),
                BatchEntry::new(a, &probe, 11),
            ],
            "twice",
        ),
    ];
    for (entries, what) in &bad {
        let err = e.forward_batch(entries).unwrap_err();
        let msg = err.to_string().to_lowercase() + &format!("{:?}", err.inner()).to_lowercase();
        assert!(msg.contains(&what.to_lowercase()), "{what}: {err}");
        assert_eq!(e.cells(), &before_cells, "{what}: the cell table changed");
    }
    // A batch past the arena (each entry fits the context, together they do not).
    let c = e.seq_create();
    let d = e.seq_create();
    let fill = tokens(40, 4, vocab);
    let before_cells = e.cells().clone();
    let err = e
        .forward_batch(&[
            BatchEntry::new(c, &fill, 0),
            BatchEntry::new(d, &fill[..10], 0),
        ])
        .unwrap_err();
    assert!(matches!(err, Error::ArenaFull { needed: 50, .. }), "{err}");
    assert_eq!(e.cells(), &before_cells);
    let after = next(&mut e);
    assert!(bits_eq(&before.0, &after.0) && bits_eq(&before.1, &after.1));
}
