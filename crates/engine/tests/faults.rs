//! Armed faults ([`minfer_engine::faults`]) on a synthetic model: a forward that fails after
//! the backend ran leaves the cell table exactly as it was (the staging checkpoint undoes
//! the batch's reservations), the error names the faulted entry or none, and the sequences
//! rerun without the faulted one get the logits of an engine that never saw the fault.
//! NaN logits reach only the faulted entry's rows.
//!
//! Control, tried by hand once (the test failed, then it was reverted): `forward_batch`
//! returning the fault's error without rolling back (the batch's new cells stay taken).

use minfer_engine::{BatchEntry, Engine, Error, InjectedFault, SeqId};
use minfer_gguf::GgmlType;
use minfer_models::Arch;
use minfer_testkit::synth::*;

fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// An engine with two prefilled sequences; returns them and their prompt lengths.
fn two_sequences(path: &std::path::Path) -> (Engine, [SeqId; 2], [usize; 2]) {
    let mut e = engine(path, 128, GgmlType::F32);
    let vocab = e.hparams().vocab_size;
    let (a, b) = (e.seq_create(), e.seq_create());
    let (pa, pb) = (tokens(9, 1, vocab), tokens(13, 2, vocab));
    e.forward_batch(&[BatchEntry::new(a, &pa, 0), BatchEntry::new(b, &pb, 0)])
        .unwrap();
    (e, [a, b], [pa.len(), pb.len()])
}

#[test]
fn a_failed_forward_leaves_the_cells_as_they_were_and_the_others_rerun_unchanged() {
    let path = model(Arch::Llama, 2, 7);
    let (mut plain, [pa, pb], [na, nb]) = two_sequences(&path);
    let probe = [3u32, 5];
    let want = plain
        .forward_batch(&[
            BatchEntry::generated(pa, &probe[..1], na),
            BatchEntry::generated(pb, &probe[1..], nb),
        ])
        .unwrap();
    let (want_a, want_b) = (want.logits(0).to_vec(), want.logits(1).to_vec());

    for (fault, names_entry) in [
        (InjectedFault::FailNamingEntry, true),
        (InjectedFault::FailUnattributed, false),
    ] {
        let (mut e, [a, b], [na, nb]) = two_sequences(&path);
        let before = e.cells().clone();
        e.inject_fault(b, fault);
        let both = [
            BatchEntry::generated(a, &probe[..1], na),
            BatchEntry::generated(b, &probe[1..], nb),
        ];
        let err = match e.forward_batch(&both) {
            Ok(_) => panic!("{fault:?}: the forward ran"),
            Err(err) => err,
        };
        match (&err, names_entry) {
            (Error::Entry { entry: 1, source }, true) => {
                assert!(matches!(**source, Error::Injected(_)), "{err}")
            }
            (Error::Injected(_), false) => {}
            _ => panic!("{fault:?}: {err}"),
        }
        assert_eq!(*e.cells(), before, "{fault:?}: the cells changed");
        e.cells().check().unwrap();
        // Without the faulted sequence the forward runs, and gives the plain engine's logits.
        let got = e.forward_batch(&both[..1]).unwrap();
        assert!(bits_eq(got.logits(0), &want_a), "{fault:?}");
        // Once disarmed, the faulted one catches up with the same logits too.
        e.clear_faults();
        let got = e.forward_batch(&both[1..]).unwrap();
        assert!(bits_eq(got.logits(0), &want_b), "{fault:?}");
    }
}

#[test]
fn nan_logits_reach_only_the_faulted_rows_and_go_with_the_sequence() {
    let path = model(Arch::Llama, 2, 7);
    let (mut plain, [pa, pb], [na, nb]) = two_sequences(&path);
    let probe = [3u32, 5];
    let want_a = plain
        .forward_batch(&[
            BatchEntry::generated(pa, &probe[..1], na),
            BatchEntry::generated(pb, &probe[1..], nb),
        ])
        .unwrap()
        .logits(0)
        .to_vec();

    let (mut e, [a, b], [na, nb]) = two_sequences(&path);
    e.inject_fault(b, InjectedFault::NanLogits);
    let out = e
        .forward_batch(&[
            BatchEntry::generated(a, &probe[..1], na),
            BatchEntry::generated(b, &probe[1..], nb),
        ])
        .unwrap();
    assert!(bits_eq(out.logits(0), &want_a));
    let row = out.logits(1);
    let nan = row.iter().filter(|l| l.is_nan()).count();
    assert_eq!(nan, row.len().div_ceil(2), "every second logit");
    assert!(row.iter().skip(1).step_by(2).all(|l| l.is_finite()));
    // A released sequence takes its fault with it: a new one is not struck.
    e.seq_release(b).unwrap();
    let c = e.seq_create();
    let out = e.forward_batch(&[BatchEntry::new(c, &probe, 0)]).unwrap();
    assert!(out.logits(0).iter().all(|l| l.is_finite()));
}
