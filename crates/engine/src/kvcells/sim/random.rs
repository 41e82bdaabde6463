//! The random side of the harness: a seeded generator and the random operation step.

use super::Sim;
use crate::kvcells::SeqId;

/// splitmix64: a small seeded generator, enough for test inputs.
pub(in crate::kvcells) struct Rng(u64);

impl Rng {
    pub(in crate::kvcells) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`, `n > 0` (the modulo bias is irrelevant here).
    pub(in crate::kvcells) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `percent`%.
    pub(in crate::kvcells) fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

/// A sequence id no test ever creates.
fn unknown(rng: &mut Rng) -> SeqId {
    SeqId(50_000 + rng.below(100) as u32)
}

impl Sim {
    /// A random sequence, now and then an unknown one.
    fn pick(&self, rng: &mut Rng) -> SeqId {
        if self.shadow.is_empty() || rng.chance(4) {
            return unknown(rng);
        }
        let i = rng.below(self.shadow.len());
        *self.shadow.keys().nth(i).expect("in range")
    }

    /// A random (sequence, position) whose cell is shared, if any.
    fn pick_shared(&self, rng: &mut Rng) -> Option<(SeqId, usize)> {
        let owners = &self.cells.owners;
        let shared: Vec<(SeqId, usize)> = (self.cells.seqs.iter())
            .flat_map(|(&id, runs)| {
                runs.iter()
                    .flat_map(move |r| r.cells().zip(r.pos..).map(move |h| (id, h)))
            })
            .filter(|&(_, (c, _))| owners[c] > 1)
            .map(|(id, (_, p))| (id, p))
            .collect();
        (!shared.is_empty()).then(|| shared[rng.below(shared.len())])
    }

    /// A random sequence other than `not` when there is one, now and then an unknown one.
    fn pick_other(&self, rng: &mut Rng, not: SeqId) -> SeqId {
        let others: Vec<SeqId> = self.shadow.keys().copied().filter(|&s| s != not).collect();
        if others.is_empty() || rng.chance(4) {
            return unknown(rng);
        }
        others[rng.below(others.len())]
    }

    /// One random operation.
    pub(in crate::kvcells) fn step(&mut self, rng: &mut Rng) -> Result<(), String> {
        // A nearly full table refuses most reserves and every copy-on-write: halve a
        // sequence now and then to keep room.
        if self.cells.n_free() < self.cells.n_cells() / 4 && rng.chance(40) {
            let seq = self.pick(rng);
            return self.do_truncate(seq, self.next_pos(seq) / 2);
        }
        match rng.below(100) {
            0..=8 if self.shadow.len() < 7 => self.do_create().map(drop),
            0..=10 => self.do_create_with_id(SeqId(rng.below(12) as u32)),
            11..=38 => {
                let mut pool: Vec<SeqId> = self.shadow.keys().copied().collect();
                let mut reqs = Vec::new();
                for _ in 0..1 + rng.below(4) {
                    if pool.is_empty() {
                        break;
                    }
                    let seq = pool.swap_remove(rng.below(pool.len()));
                    let n = match rng.below(10) {
                        0 => 0,
                        1 => 1 + rng.below(8),
                        _ => 1 + rng.below(2),
                    };
                    reqs.push((seq, self.next_pos(seq), n));
                }
                if rng.chance(10) {
                    match rng.below(3) {
                        0 => reqs.push((unknown(rng), 0, 1)),
                        1 if !reqs.is_empty() => reqs.push(reqs[rng.below(reqs.len())]),
                        _ => {
                            if let Some(r) = reqs.last_mut() {
                                r.1 = if r.1 > 0 && rng.chance(50) {
                                    r.1 - 1
                                } else {
                                    r.1 + 1
                                };
                            }
                        }
                    }
                }
                self.do_reserve(&reqs)
            }
            39..=46 => {
                let seq = self.pick(rng);
                let start = rng.below(self.next_pos(seq) + 2);
                let end = start + rng.below(self.next_pos(seq) + 3 - start);
                let range = if rng.chance(5) {
                    end + 1..start
                } else {
                    start..end
                };
                self.do_remove(seq, range)
            }
            47..=51 => {
                let seq = self.pick(rng);
                self.do_truncate(seq, rng.below(self.next_pos(seq) + 2))
            }
            52..=65 => {
                // Half the time from a shared position on (copy-on-write), mostly forward.
                if let Some((seq, p)) = rng.chance(50).then(|| self.pick_shared(rng)).flatten() {
                    let end = if rng.chance(60) {
                        usize::MAX
                    } else {
                        p + 1 + rng.below(4)
                    };
                    let delta = rng.below(12) as i64 - 3;
                    return self.do_shift(seq, p..end, delta);
                }
                let seq = self.pick(rng);
                let start = rng.below(self.next_pos(seq) + 2);
                // Tail shifts are the ones that can move shared prefixes without collision.
                let end = match rng.below(20) {
                    0..=6 => usize::MAX,
                    7 if start > 0 => start - 1,
                    _ => start + rng.below(self.next_pos(seq) + 3 - start),
                };
                let delta = match rng.below(40) {
                    0 => i64::MAX,
                    1 => -i64::MAX,
                    _ => rng.below(17) as i64 - 8,
                };
                self.do_shift(seq, start..end, delta)
            }
            66..=83 => {
                let dst = self.pick(rng);
                let src = if rng.chance(6) {
                    dst
                } else {
                    self.pick_other(rng, dst)
                };
                let next = self.next_pos(src);
                let n = match rng.below(20) {
                    0 => next + 1,
                    1..=8 => next,
                    _ => rng.below(next + 1),
                };
                if rng.below(16) < 6 {
                    self.do_copy_prefix(dst, src, n)
                } else {
                    self.do_share_prefix(dst, src, n)
                }
            }
            84..=87 => {
                let seq = self.pick(rng);
                self.do_clear(seq, rng.chance(50))
            }
            _ => self.do_defrag(),
        }
    }
}
