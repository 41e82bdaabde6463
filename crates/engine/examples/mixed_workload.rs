//! A server-like mixed workload for a fixed wall time, reporting how many graphs the engine
//! built (the graph cache's misses) and how many distinct forward shapes it saw.
//!
//! Up to `--parallel` sequences run at once; a finished one is replaced by a new request with
//! a random prompt (1..=`--max-prompt` tokens) and a random reply length (1..=128). Every step
//! is one forward: a decode token per generating sequence, then prompt chunks while the batch
//! has room (the policy of `generate::generate_batch`).
//!
//! ```text
//! cargo run --release -p minfer-engine --example mixed_workload -- MODEL [--seconds 600]
//!     [--parallel 8] [--max-prompt 600] [--threads 2]
//! ```

use minfer_engine::{BatchEntry, Engine, EngineConfig, SeqId};
use minfer_gguf::GgmlType;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

struct Req {
    seq: SeqId,
    prompt: Vec<u32>,
    fed: usize,
    gen_left: usize,
    next: Option<u32>,
    pos: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = args
        .get(1)
        .ok_or("usage: mixed_workload MODEL [--seconds S] ...")?;
    let flag = |name: &str, default: usize| -> usize {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let seconds = flag("--seconds", 600);
    let parallel = flag("--parallel", 8);
    let max_prompt = flag("--max-prompt", 600);
    let threads = flag("--threads", 2);
    let mut e = Engine::load(
        model,
        EngineConfig {
            n_ctx: 8192,
            threads,
            cache_type: GgmlType::F16,
            ..EngineConfig::default()
        },
    )?;
    let vocab = e.hparams().vocab_size as u64;
    let mut rng = minfer_testkit::rng::Rng::xorshift64_raw(0x2545_f491_4f6c_dd1d);
    let mut rand = move |n: u64| rng.next_u64() % n;
    let mut reqs: Vec<Req> = Vec::new();
    let (mut forwards, mut tokens, mut finished) = (0usize, 0usize, 0usize);
    let mut shapes = BTreeSet::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(seconds as u64) {
        while reqs.len() < parallel {
            let plen = 1 + rand(max_prompt as u64) as usize;
            reqs.push(Req {
                seq: e.seq_create(),
                prompt: (0..plen).map(|_| rand(vocab) as u32).collect(),
                fed: 0,
                gen_left: 1 + rand(128) as usize,
                next: None,
                pos: 0,
            });
        }
        let mut room = e.n_batch();
        let mut plan: Vec<(usize, usize, bool)> = Vec::new(); // (req, len, decode)
        for (i, r) in reqs.iter().enumerate() {
            if r.next.is_some() && room > 0 {
                plan.push((i, 1, true));
                room -= 1;
            }
        }
        for (i, r) in reqs.iter().enumerate() {
            if r.next.is_none() && r.fed < r.prompt.len() && room > 0 {
                let n = (r.prompt.len() - r.fed).min(room);
                plan.push((i, n, false));
                room -= n;
            }
        }
        let toks: Vec<[u32; 1]> = plan
            .iter()
            .map(|&(i, _, _)| [reqs[i].next.unwrap_or(0)])
            .collect();
        let entries: Vec<BatchEntry> = plan
            .iter()
            .zip(&toks)
            .map(|(&(i, n, decode), t)| {
                let r = &reqs[i];
                if decode {
                    BatchEntry::generated(r.seq, t, r.pos)
                } else {
                    BatchEntry::prompt(
                        r.seq,
                        &r.prompt[r.fed..r.fed + n],
                        r.fed,
                        usize::from(r.fed + n == r.prompt.len()),
                    )
                }
            })
            .collect();
        let n_tok: usize = entries.iter().map(|x| x.tokens.len()).sum();
        let n_out: usize = entries.iter().map(|x| x.logits).sum();
        shapes.insert((
            minfer_engine::bucket(n_tok),
            minfer_engine::bucket(n_out.max(1)),
        ));
        let out = e.forward_batch(&entries)?;
        // Greedy next tokens, so the workload needs no sampler.
        let nexts: Vec<Option<u32>> = (0..entries.len())
            .map(|k| {
                let l = out.logits(k);
                (!l.is_empty()).then(|| {
                    l.iter()
                        .enumerate()
                        .max_by(|a, b| a.1.total_cmp(b.1))
                        .map_or(0, |(i, _)| i as u32)
                })
            })
            .collect();
        forwards += 1;
        tokens += n_tok;
        for (&(i, n, decode), next) in plan.iter().zip(nexts) {
            let r = &mut reqs[i];
            if decode {
                r.pos += 1;
                r.gen_left -= 1;
            } else {
                r.fed += n;
                r.pos = r.fed;
            }
            r.next = next.filter(|_| r.gen_left > 0);
        }
        let mut k = 0;
        while k < reqs.len() {
            let r = &reqs[k];
            if r.fed == r.prompt.len() && (r.gen_left == 0 || r.next.is_none()) {
                let r = reqs.remove(k);
                e.seq_release(r.seq)?;
                finished += 1;
            } else {
                k += 1;
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{{\"seconds\": {secs:.1}, \"forwards\": {forwards}, \"tokens\": {tokens}, \
         \"requests_finished\": {finished}, \"distinct_shapes\": {}, \"graphs_built\": {}}}",
        shapes.len(),
        e.graph_builds()
    );
    Ok(())
}
