//! The timing loop's shape, `--trace`'s arming and the synthetic tokens, against a
//! recording stand-in for the engine.

use super::*;

/// Records every decode call so the loop's shape can be checked.
#[derive(Default)]
struct Recorder {
    calls: Vec<(usize, usize, usize)>,
    /// The row class of each call.
    classes: Vec<RowClass>,
    clears: usize,
    /// Whether the trace is armed, and whether each call ran armed.
    armed: bool,
    armed_calls: Vec<bool>,
}

impl Target for Recorder {
    fn kv_clear(&mut self) {
        self.clears += 1;
    }
    fn decode(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        n_out: usize,
        class: RowClass,
    ) -> anyhow::Result<()> {
        self.calls.push((tokens.len(), pos0, n_out));
        self.classes.push(class);
        self.armed_calls.push(self.armed);
        Ok(())
    }
    fn trace_begin(&mut self) -> anyhow::Result<()> {
        self.armed = true;
        Ok(())
    }
    fn trace_end(&mut self, _: &std::path::Path) -> anyhow::Result<usize> {
        self.armed = false;
        Ok(self.armed_calls.iter().filter(|&&a| a).count())
    }
    fn n_batch(&self) -> usize {
        512
    }
    fn seq_create(&mut self) -> SeqId {
        SeqId(1)
    }
    fn seq_clear(&mut self, _: SeqId) -> anyhow::Result<()> {
        Ok(())
    }
    fn seq_remove(&mut self, _: SeqId, _: std::ops::Range<usize>) -> anyhow::Result<()> {
        Ok(())
    }
    fn seq_copy_prefix(&mut self, _: SeqId, _: SeqId, _: usize) -> anyhow::Result<()> {
        Ok(())
    }
    fn forward_batch(&mut self, _: &[BatchEntry]) -> anyhow::Result<()> {
        unreachable!("pp and tg decode one sequence")
    }
}

#[test]
fn prompt_test_is_one_forward_per_repetition_after_a_warm_up() {
    let mut r = Recorder::default();
    let tokens = synthetic_tokens(512, 1000, 1);
    let ns = time_test(
        &mut r,
        Test::Prompt(512),
        &tokens,
        &[],
        3,
        true,
        &Progress::none(),
    )
    .unwrap();
    assert_eq!(ns.len(), 3);
    assert_eq!(r.calls, vec![(512, 0, 1); 4]);
    // A clear before each of the 4 runs, one after.
    assert_eq!(r.clears, 5);
}

#[test]
fn gen_test_is_n_single_token_steps_from_position_zero() {
    let mut r = Recorder::default();
    let tokens = synthetic_tokens(4, 1000, 1);
    time_test(
        &mut r,
        Test::Gen(4),
        &tokens,
        &[],
        2,
        true,
        &Progress::none(),
    )
    .unwrap();
    // Warm-up: one step; then two runs of positions 0..4.
    let run: Vec<_> = (0..4).map(|p| (1, p, 1)).collect();
    let mut want = vec![(1, 0, 1)];
    want.extend(run.iter().copied());
    want.extend(run.iter().copied());
    assert_eq!(r.calls, want);
    // tg's steps are the engine's own tokens: generation rows (as prompt rows they ran
    // the prompt kernels on the GPU, 0.19x llama.cpp's decode).
    assert!(r.classes.iter().all(|&c| c == RowClass::Generation));
}

#[test]
fn depth_is_prefilled_before_every_run_and_the_test_starts_after_it() {
    let mut r = Recorder::default();
    let tokens = synthetic_tokens(3, 1000, 1);
    let depth = synthetic_tokens(10, 1000, 2);
    time_test(
        &mut r,
        Test::Gen(3),
        &tokens,
        &depth,
        1,
        true,
        &Progress::none(),
    )
    .unwrap();
    // Warm-up: depth, one step at 10; the run: depth, steps at 10, 11, 12.
    let want = vec![
        (10, 0, 1),
        (1, 10, 1),
        (10, 0, 1),
        (1, 10, 1),
        (1, 11, 1),
        (1, 12, 1),
    ];
    assert_eq!(r.calls, want);
    use RowClass::{Generation as G, Prompt as P};
    assert_eq!(
        r.classes,
        [P, G, P, G, G, G],
        "the depth is a prompt, the steps not"
    );
    let mut r = Recorder::default();
    time_test(
        &mut r,
        Test::Prompt(3),
        &tokens,
        &depth,
        1,
        false,
        &Progress::none(),
    )
    .unwrap();
    assert_eq!(r.calls, vec![(10, 0, 1), (3, 10, 1)]);
    assert_eq!(depth_suffix(2048), " @ d2048");
    assert_eq!(depth_suffix(0), "");
}

/// `--trace`: the timed repetitions run disarmed, then one armed run per test, and the
/// trace is disarmed after. Control: a traced_runs that armed before time_test would
/// mark the timed calls armed and fail the first assertion.
#[test]
fn traced_runs_come_after_the_timed_ones_and_only_they_are_armed() {
    let mut r = Recorder::default();
    let tokens = synthetic_tokens(3, 1000, 1);
    time_test(
        &mut r,
        Test::Gen(3),
        &tokens,
        &[],
        2,
        true,
        &Progress::none(),
    )
    .unwrap();
    let timed = r.calls.len();
    assert!(r.armed_calls.iter().all(|&a| !a));
    let runs = vec![
        (Test::Prompt(3), tokens.clone(), vec![]),
        (Test::Gen(3), tokens.clone(), vec![]),
    ];
    let n = trace::traced_runs(&mut r, &runs, std::path::Path::new("unused")).unwrap();
    // One pp forward and three tg steps, all armed; disarmed after.
    assert_eq!(n, 4);
    assert_eq!(r.calls.len(), timed + 4);
    assert!(r.armed_calls[timed..].iter().all(|&a| a));
    assert!(!r.armed);
}

#[test]
fn synthetic_tokens_are_valid_seeded_and_varied() {
    let a = synthetic_tokens(1000, 151_936, 7);
    assert_eq!(a, synthetic_tokens(1000, 151_936, 7));
    assert_ne!(a, synthetic_tokens(1000, 151_936, 8));
    assert!(a.iter().all(|&t| t < 151_936));
    let distinct: std::collections::HashSet<_> = a.iter().collect();
    assert!(distinct.len() > 900, "{} distinct", distinct.len());
}
