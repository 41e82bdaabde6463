//! Tokenizer benchmark (run by `scripts/tokenizer-bench`; a benchmark, not a test).
//!
//! `tokenizer_bench MODEL CORPUS [REPS]` prints one JSON line:
//! - `open_ms`: `GgufFile::open` (maps the file, parses all metadata incl. the token and merge
//!   string arrays), median over REPS;
//! - `build_ms`: `Tokenizer::from_metadata` (vocabulary, merge table, special sets), median;
//!   `build_cpu_ms` its process CPU time, all threads (the machine may be shared; the merge
//!   table is resolved on several threads);
//! - `encode_ms`: encoding the whole corpus on this thread with NFC (the same work as the HF
//!   tokenizer it is compared with), median over REPS after one warm-up run, so with a warm
//!   word cache (`encode_cpu_ms`: thread CPU time);
//! - `encode_cold_ms`: encoding with an empty word cache (cleared before each run), median;
//! - `encode_raw_ms`: the same without NFC (llama.cpp's behaviour);
//! - `n_tokens` and `checksum` of the ids, to check both sides tokenized alike.

use minfer_gguf::GgufFile;
use minfer_tokenizer::{Normalization, Tokenizer};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// CPU time of the whole process (all threads, exited ones included) in ms, from
/// `/proc/self/stat` (utime + stime, at the usual 100 ticks per second: 10 ms resolution,
/// averaged over the repetitions); NaN elsewhere.
fn process_cpu_ms() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i)
            .and_then(|x| x.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (ticks(11) + ticks(12)) * 10.0
}

/// This thread's CPU time in ms (Linux `/proc/thread-self/schedstat`), or NaN elsewhere. On a
/// shared machine wall time includes waiting for a core; CPU time does not.
fn cpu_ms() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |ns| ns / 1e6)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: tokenizer_bench MODEL CORPUS [REPS]");
        std::process::exit(2);
    }
    let reps: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(5);
    let corpus = std::fs::read_to_string(&args[2])?;

    let (mut open_ms, mut build_ms) = (Vec::new(), Vec::new());
    let mut files = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        files.push(GgufFile::open(&args[1])?);
        open_ms.push(ms(t));
    }
    let mut tok = None;
    let c = process_cpu_ms();
    for file in &files {
        let t = Instant::now();
        tok = Some(Tokenizer::from_metadata(&file.header().metadata)?);
        build_ms.push(ms(t));
    }
    let build_cpu_ms = (process_cpu_ms() - c) / reps as f64;
    let tok = tok.ok_or("REPS must be at least 1")?;
    let tok = tok.with_normalization(Normalization::Nfc);

    let ids = tok.encode(&corpus, false);
    let mut encode_cold_ms = Vec::new();
    for _ in 0..reps {
        tok.clear_cache();
        let t = Instant::now();
        let again = tok.encode(&corpus, false);
        encode_cold_ms.push(ms(t));
        assert_eq!(again, ids);
    }
    let (mut encode_ms, mut encode_cpu_ms) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let (t, c) = (Instant::now(), cpu_ms());
        let again = tok.encode(&corpus, false);
        encode_ms.push(ms(t));
        encode_cpu_ms.push(cpu_ms() - c);
        assert_eq!(again.len(), ids.len());
    }
    let tok = tok.with_normalization(Normalization::None);
    let mut encode_raw_ms = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let again = tok.encode(&corpus, false);
        encode_raw_ms.push(ms(t));
        assert_eq!(again.len(), ids.len());
    }
    let checksum = ids.iter().fold(0u64, |h, &id| {
        h.wrapping_mul(1_000_003).wrapping_add(id as u64)
    });
    println!(
        "{{\"side\": \"minfer\", \"bytes\": {}, \"n_tokens\": {}, \"checksum\": {}, \"open_ms\": {:.2}, \"build_ms\": {:.2}, \"build_cpu_ms\": {:.2}, \"encode_cold_ms\": {:.2}, \"encode_ms\": {:.2}, \"encode_cpu_ms\": {:.2}, \"encode_raw_ms\": {:.2}}}",
        corpus.len(),
        ids.len(),
        checksum,
        median(open_ms),
        median(build_ms),
        build_cpu_ms,
        median(encode_cold_ms),
        median(encode_ms),
        median(encode_cpu_ms),
        median(encode_raw_ms)
    );
    Ok(())
}
