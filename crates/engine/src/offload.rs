//! Layer offload (issue 32, ADR 0014): which blocks of the model run on the device backend
//! and which on the CPU, decided once at load from the GGUF tensor index, before any weight
//! is uploaded.
//!
//! - `--gpu-layers N`: blocks `0..N` on the device (N past the model's blocks is clamped, as
//!   llama.cpp's `-ngl`); the embedding, final norm and output head go on the device only
//!   when every block does, unless `--offload-head` puts the final norm and output head (the
//!   output position) there with any number of blocks, as llama.cpp's `-ngl` does from 1
//!   (its N counts the output layer: `-ngl N` there holds what `--gpu-layers N-1
//!   --offload-head` holds here).
//! - `--gpu-layers auto` (the default with a device backend): the largest prefix of blocks
//!   whose device bytes ([`BlockCosts`]: weights, the fused concatenations a device builds,
//!   and the block's K and V at the context) fit the budget less a reserve for
//!   activations, the pool and the device's own scratch. The budget is `--gpu-mem`, else
//!   the device's free memory as its memory layer reports it; a failed query is
//!   [`Error::MemoryQuery`], never a zero. The allocator checks the graph's buffers against
//!   the budget and the device every allocation of its own (`Memory::set_device_budget`).
//!
//! A plan with every block and the head on the device is placed exactly as before offload
//! existed (every backend holds every weight); any other plan places each block's weights on
//! its backend only ([`minfer_graph::place_by_layer`]), the CPU holding every weight so a
//! node a device refuses still has a home. Values crossing a block boundary are staged by
//! the scheduler (one copy per value and destination per forward).

use crate::backends::{self, CPU_ID};
use crate::config::{EngineConfig, GpuLayers};
use crate::error::{Error, Result};
use crate::weights::ModelWeights;
use minfer_gguf::GgmlType;
use minfer_graph::{Backend, BackendId, Graph, LayerPlan, Placement, WeightId, WeightSource};
use minfer_models::HParams;

/// Bytes of activation buffers and pool slack `auto` keeps free beside the blocks: at most
/// what the graph cache lets cached plans hold together, plus this slack.
const POOL_SLACK: u64 = 16 << 20;

/// What the planner charges, per block and beside them, in bytes (from the tensor index).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockCosts {
    /// Per block: its weights as stored in the file.
    pub weights: Vec<u64>,
    /// Per block: the weight concatenations the device would build for its fused nodes.
    pub concat: Vec<u64>,
    /// One block's K and V regions at the context (every block has the same).
    pub kv: u64,
    /// Weights outside the blocks: embedding, final norm, output head.
    pub edges: u64,
    /// Of `edges`, the output position's (final norm and output head; a head tied to the
    /// embedding counts here too): what `--offload-head` puts on the device.
    pub output: u64,
    /// Activations, pool slack and the device's own scratch (`Memory::scratch_bytes`),
    /// charged once.
    pub reserve: u64,
    /// The most weight bytes one device split of a CPU block's prompt rows streams in (op
    /// offload's arena, ADR 0014: the weights between one attention and the next), charged
    /// beside the reserve when some block stays on the CPU; 0 without op offload or when the
    /// device streams nothing.
    pub stream: u64,
}

impl BlockCosts {
    /// Device bytes of block `l` (weights, concatenations, KV).
    pub fn block(&self, l: usize) -> u64 {
        self.weights[l] + self.concat[l] + self.kv
    }

    /// What is charged beside `k` blocks: the reserve, and the stream arena when some block
    /// stays on the CPU.
    fn reserve_for(&self, k: usize) -> u64 {
        self.reserve
            + if k < self.weights.len() {
                self.stream
            } else {
                0
            }
    }

    /// The budget that holds exactly the first `k` blocks (with the head when `k` is every
    /// block and `head` is set): what a test hands `--gpu-mem` to ask for `k`.
    pub fn budget_for(&self, k: usize, head: bool) -> u64 {
        let blocks: u64 = (0..k).map(|l| self.block(l)).sum();
        self.reserve_for(k) + blocks + if head { self.edges } else { 0 }
    }

    /// The largest prefix of blocks that fits `left` bytes, and the bytes left beside it.
    fn prefix(&self, mut left: u64) -> (usize, u64) {
        let mut k = 0;
        while k < self.weights.len() && self.block(k) <= left {
            left -= self.block(k);
            k += 1;
        }
        (k, left)
    }

    /// The largest prefix that fits `budget`: (blocks, whether the head fits too).
    pub fn fit(&self, budget: u64) -> (usize, bool) {
        let fit = |reserve: u64| {
            let left = budget.checked_sub(reserve)?;
            let (k, left) = self.prefix(left);
            Some((k, k == self.weights.len() && self.edges <= left))
        };
        // Every block fits beside the reserve alone, or the arena is charged too.
        match fit(self.reserve) {
            Some((k, head)) if k == self.weights.len() => (k, head),
            _ => fit(self.reserve + self.stream).unwrap_or((0, false)),
        }
    }

    /// `--offload-head`'s fit: the output position first (None when even it does not fit
    /// beside the reserve), then the largest prefix of blocks beside it, and whether the
    /// embedding fits too once every block does (the whole model on the device).
    pub fn fit_head_first(&self, budget: u64) -> Option<(usize, bool)> {
        let fit = |reserve: u64| {
            let left = budget.checked_sub(reserve)?.checked_sub(self.output)?;
            let (k, left) = self.prefix(left);
            Some((
                k,
                k == self.weights.len() && self.edges - self.output <= left,
            ))
        };
        match fit(self.reserve) {
            Some((k, emb)) if k == self.weights.len() => Some((k, emb)),
            _ => fit(self.reserve + self.stream),
        }
    }

    /// The budget that holds the output position and the first `k` blocks (and, with
    /// `whole`, the embedding: the whole model).
    pub fn budget_for_head_first(&self, k: usize, whole: bool) -> u64 {
        let blocks: u64 = (0..k).map(|l| self.block(l)).sum();
        self.reserve_for(k) + blocks + if whole { self.edges } else { self.output }
    }
}

/// The plan as the engine took it: what the startup line says.
#[derive(Clone, Debug, PartialEq)]
pub struct Offload {
    /// The device backend's name.
    pub device: String,
    /// Blocks of the model, and how many run on the device (a prefix).
    pub n_layers: usize,
    pub on_device: usize,
    /// Whether the final norm and output head run on the device (with every block, the
    /// embedding too; with fewer, only under `--offload-head`).
    pub head_on_device: bool,
    /// Weight bytes (as stored in the file) placed on the device and left on the host.
    pub weights_device: u64,
    pub weights_host: u64,
    pub cache_type: GgmlType,
    /// The budget `auto` fitted, or `--gpu-mem` beside a count (None: a count alone).
    pub budget: Option<u64>,
    /// Why `auto` placed fewer than every block (and the head), in words.
    pub reason: Option<String>,
    /// Op offload (`--no-op-offload` turns it off): the device that multiplies the prompt
    /// rows of the CPU blocks' matmuls, weights copied in for each, and the block count
    /// (the graph's [`minfer_graph::Graph::op_offload`]). None: every block's rows on its
    /// own backend (no CPU block, the flag, or a device that streams none of their weights).
    pub op_offload: Option<(BackendId, usize)>,
    /// What the planner charged (tests derive budgets for a given count from it).
    pub costs: BlockCosts,
}

/// Bytes in the unit a person reads: GiB from 1 GiB, else MiB from 1 MiB, else KiB.
pub fn size_text(b: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    let x = b as f64;
    if b == 0 {
        "0 B".into()
    } else if b >= 1 << 30 {
        format!("{:.1} GiB", x / (MIB * 1024.0))
    } else if b >= 1 << 20 {
        format!("{:.1} MiB", x / MIB)
    } else {
        format!("{:.1} KiB", x / 1024.0)
    }
}

impl Offload {
    /// The startup line: `offload: 20 of 28 blocks on cuda, 8 on cpu; weights 3.1 GiB on
    /// device, 1.2 GiB on host; KV f16 on each block's device`.
    pub fn line(&self) -> String {
        let head = match (self.on_device == self.n_layers, self.head_on_device) {
            (true, false) => "; output head on cpu".to_string(),
            (false, true) => format!("; output head on {}", self.device),
            _ => String::new(),
        };
        let op = if self.op_offload.is_some() {
            format!(
                "; prompt rows of cpu blocks on {} (attention on cpu)",
                self.device
            )
        } else {
            String::new()
        };
        format!(
            "offload: {} of {} blocks on {}, {} on cpu{head}; weights {} on device, {} on host; \
             KV {} on each block's device{op}",
            self.on_device,
            self.n_layers,
            self.device,
            self.n_layers - self.on_device,
            size_text(self.weights_device),
            size_text(self.weights_host),
            self.cache_type.name().to_ascii_lowercase()
        )
    }
}

/// Each weight the probe graph reads, with the block of the node reading it.
fn used_by_layer(probe: &Graph) -> Vec<(WeightId, Option<usize>)> {
    let mut used: Vec<(WeightId, Option<usize>)> = probe
        .nodes
        .iter()
        .flat_map(|n| n.op.weights().map(move |w| (w, n.layer)))
        .collect();
    used.sort_unstable();
    used.dedup();
    used
}

fn bytes_of(weights: &dyn WeightSource, id: WeightId) -> u64 {
    weights.weight(id).map_or(0, |w| w.bytes.len() as u64)
}

/// The planner's charges for `device`: weights per block from the index, the concatenations
/// the device's fused nodes would read (a dry assignment and fusion of the probe graph with
/// every block on the device), KV at `n_ctx` plus the scratch cell, and the reserve (the
/// activations, the pool's slack and the device's own scratch).
pub(crate) fn block_costs(
    backends: &[Box<dyn Backend>],
    device: BackendId,
    weights: &ModelWeights<'_>,
    probe: &Graph,
    hp: &HParams,
    n_ctx: usize,
    cfg: &EngineConfig,
) -> Result<BlockCosts> {
    let n = hp.block_count;
    let mut costs = BlockCosts {
        weights: vec![0; n],
        concat: vec![0; n],
        kv: 0,
        edges: 0,
        output: 0,
        reserve: 0,
        stream: 0,
    };
    let mut seen = std::collections::HashSet::new();
    for (id, layer) in used_by_layer(probe) {
        match layer {
            Some(l) if l < n => costs.weights[l] += bytes_of(weights, id),
            // A weight outside the blocks is charged once (tied embeddings read it twice).
            _ => {
                if seen.insert(id) {
                    costs.edges += bytes_of(weights, id);
                }
                if layer == Some(n) {
                    costs.output += bytes_of(weights, id);
                }
            }
        }
    }
    let plan = LayerPlan {
        blocks: vec![device; n],
        edges: device,
    };
    let mut dry = probe.clone();
    let everywhere = Placement::everywhere(backends).with_layers(plan);
    minfer_graph::assign_backends(&mut dry, backends, weights, &everywhere)?;
    minfer_graph::fuse(&mut dry, backends, weights, cfg.settings.fusion);
    for node in dry
        .nodes
        .iter()
        .filter(|n| !n.dead && n.backend == Some(device))
    {
        if let Some(l) = node.layer.filter(|&l| l < n) {
            for g in node.op.concat_groups() {
                costs.concat[l] += g.iter().map(|&id| bytes_of(weights, id)).sum::<u64>();
            }
        }
    }
    let n_embd_kv = (hp.head_count_kv * hp.head_dim) as u64;
    let row = cfg.cache_type.row_bytes(n_embd_kv).unwrap_or(0);
    costs.kv = 2 * row * (n_ctx as u64 + 1);
    // One forward of a full batch: the residual and its norm, q, k, v, attention's output,
    // the FFN's two halves, attention scores over the context, and every row's logits.
    let (d, ff, q) = (
        hp.embedding_length as u64,
        hp.feed_forward_length as u64,
        (hp.head_count * hp.head_dim) as u64,
    );
    let nb = cfg.n_batch.max(1) as u64;
    let per_row =
        3 * d + 2 * q + 2 * n_embd_kv + 2 * ff + hp.head_count as u64 * (n_ctx as u64 + 1);
    let act = 4 * nb * (per_row + hp.vocab_size as u64);
    costs.reserve = act.min(crate::config::GRAPH_CACHE_BYTES as u64) + POOL_SLACK;
    // What the device allocates beside the graph's buffers (its scratch, a library's
    // workspace): every allocation is checked against the budget, so the plan leaves room.
    if let Some(dev) = backends.iter().find(|b| b.id() == device) {
        let mut ids: Vec<WeightId> = used_by_layer(probe).into_iter().map(|(id, _)| id).collect();
        ids.sort_unstable();
        ids.dedup();
        costs.reserve += dev.scratch_bytes(weights, &ids, cfg.n_batch.max(1));
    }
    // A context sized from the free memory after the weights keeps the KV's reserve free
    // (crate::kvsize): the blocks fit beside it, so the default context's KV always fits.
    if let crate::KvSize::FreeMemory { .. } = cfg.kv_size {
        costs.reserve = costs.reserve.max(crate::kvsize::KV_RESERVE);
    }
    if cfg.op_offload {
        costs.stream = stream_arena(backends, device, weights, probe, n);
    }
    Ok(costs)
}

/// The most weight bytes the device streams in for one split of a prompt forward with every
/// block on the CPU (streamed blocks, ADR 0014): the weights of blocks' nodes between one KV
/// node and the next, in the probe's order, of those the device can stream, each rounded up
/// as the arena lays them out.
fn stream_arena(
    backends: &[Box<dyn Backend>],
    device: BackendId,
    weights: &ModelWeights<'_>,
    probe: &Graph,
    n: usize,
) -> u64 {
    let Some(dev) = backends.iter().find(|b| b.id() == device) else {
        return 0;
    };
    let (mut most, mut run) = (0u64, 0u64);
    let mut seen = std::collections::HashSet::new();
    for node in probe.nodes.iter().filter(|n| !n.dead) {
        if node.op.kv_layer().is_some() {
            run = 0;
            seen.clear();
            continue;
        }
        if node.layer.is_none_or(|l| l >= n) {
            continue;
        }
        for id in node.op.weights() {
            let streams = weights
                .weight(id)
                .is_some_and(|w| dev.can_stream(&w).is_ok());
            if streams && seen.insert(id) {
                run += bytes_of(weights, id).next_multiple_of(256);
            }
        }
        most = most.max(run);
    }
    most
}

/// What the planner decided: the placement made and the plan to report (None when no
/// device takes part, or the device cannot hold the model's weights: placed as before).
pub(crate) struct Planned {
    pub placement: Placement,
    pub offload: Option<Offload>,
    /// The device and the budget its allocations are checked against.
    pub budget: Option<(BackendId, usize)>,
}

/// Plans and places the model's weights (see the module docs). `given`: the device's blocks
/// (a prefix), whether the head goes there too and whether the embedding does (the whole
/// model), decided elsewhere (a self-draft takes its target's, ADR 0013), in place of
/// `cfg.gpu_layers`.
pub(crate) fn place(
    backends: &mut [Box<dyn Backend>],
    weights: &ModelWeights<'_>,
    probe: &Graph,
    hp: &HParams,
    n_ctx: usize,
    cfg: &EngineConfig,
    given: Option<(usize, bool, bool)>,
) -> Result<Planned> {
    let used = used_by_layer(probe);
    let mut ids: Vec<WeightId> = used.iter().map(|&(id, _)| id).collect();
    ids.sort_unstable();
    ids.dedup();
    let whole = |backends: &mut [Box<dyn Backend>]| -> Result<Placement> {
        Ok(minfer_graph::place_weights(backends, weights, &ids)?)
    };
    let device = backends
        .iter()
        .find(|b| backends::is_device(b.id()))
        .map(|b| b.id());
    let Some(device) = device else {
        return Ok(Planned {
            placement: whole(backends)?,
            offload: None,
            budget: None,
        });
    };
    let dev = backends
        .iter()
        .find(|b| b.id() == device)
        .map(|b| b.as_ref())
        .ok_or_else(|| Error::BadRequest("the device backend is gone".into()))?;
    // A device that cannot hold some weight holds none, as before offload (the placement
    // report names the weight).
    if minfer_graph::first_refusal(dev, weights, &ids).is_some() {
        return Ok(Planned {
            placement: whole(backends)?,
            offload: None,
            budget: None,
        });
    }
    let name = dev.name().to_string();
    let costs = block_costs(backends, device, weights, probe, hp, n_ctx, cfg)?;
    let n = hp.block_count;
    // k: blocks on the device; head: the output position there; whole: the embedding too
    // (every weight: placed as before offload existed).
    let (k, head, whole_model, budget, reason) = match (given, cfg.gpu_layers) {
        (Some((k, head, whole)), _) => {
            let k = k.min(n);
            (k, head, whole && k == n, None, None)
        }
        (None, GpuLayers::Count(c)) => {
            // A count the user gave is placed as given; `--gpu-mem` beside it still bounds
            // what the device's allocations may hold (a plan past it is refused there).
            let k = c.min(n);
            let budget = cfg.gpu_mem.map(|b| b as u64);
            (k, k == n || cfg.offload_head, k == n, budget, None)
        }
        (None, GpuLayers::Auto) => {
            let (budget, source) = match cfg.gpu_mem {
                Some(b) => (b as u64, "--gpu-mem".to_string()),
                None => match dev.free_memory() {
                    Ok(b) => (b as u64, format!("{name}'s free memory")),
                    Err(why) => {
                        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
                        let w: u64 = costs.weights.iter().sum::<u64>() + costs.edges;
                        return Err(Error::MemoryQuery {
                            backend: name,
                            why: why.0,
                            weights_mib: mib(w),
                            need_mib: mib(costs.budget_for(n, true)),
                        });
                    }
                },
            };
            match cfg
                .offload_head
                .then(|| costs.fit_head_first(budget))
                .flatten()
            {
                Some((k, emb)) => {
                    let reason = (!emb).then(|| head_first_reason(&costs, k, budget, &source));
                    (k, true, emb, Some(budget), reason)
                }
                None => {
                    let (k, head) = costs.fit(budget);
                    let mut reason = (!head).then(|| fit_reason(&costs, k, budget, &source));
                    if cfg.offload_head {
                        if let Some(r) = reason.as_mut() {
                            r.push_str(&format!(
                                "; the output head ({}) does not fit beside the reserve",
                                size_text(costs.output)
                            ));
                        }
                    }
                    (k, head, head, Some(budget), reason)
                }
            }
        }
    };
    // Op offload: a CPU block's prompt rows run on the device (streamed blocks) when it
    // can stream at least one of those blocks' matrices (assignment asks it again per node).
    let op_offload = (k < n
        && cfg.op_offload
        && used.iter().any(|&(id, l)| {
            l.is_some_and(|l| l >= k && l < n)
                && weights
                    .weight(id)
                    .is_some_and(|w| w.ne1 > 1 && dev.can_stream(&w).is_ok())
        }))
    .then_some((device, n));
    let blocks_device: u64 = costs.weights[..k].iter().sum();
    let total: u64 = costs.weights.iter().sum::<u64>() + costs.edges;
    let weights_device = blocks_device
        + match (whole_model, head) {
            (true, _) => costs.edges,
            (false, true) => costs.output,
            (false, false) => 0,
        };
    let placement = if k == n && whole_model {
        whole(backends)?
    } else {
        let mut blocks: Vec<BackendId> = (0..n)
            .map(|l| if l < k { device } else { CPU_ID })
            .collect();
        if head {
            // The output position (the layer index one past the last block).
            blocks.push(device);
        }
        let plan = LayerPlan {
            blocks,
            edges: CPU_ID,
        };
        let placement = minfer_graph::place_by_layer(backends, weights, &used, &plan, CPU_ID)?;
        if op_offload.is_some() {
            // The device copies the CPU blocks' matrices in every prompt forward: their
            // pages stay resident (the CPU's packing would release them).
            let streamed: Vec<WeightId> = used
                .iter()
                .filter(|&&(_, l)| l.is_some_and(|l| l >= k && l < n))
                .map(|&(id, _)| id)
                .collect();
            if let Some(cpu) = backends.iter_mut().find(|b| b.id() == CPU_ID) {
                cpu.keep_weight_bytes(&streamed);
            }
            if let Some(dev) = backends.iter_mut().find(|b| b.id() == device) {
                dev.prepare_streamed(weights, &streamed)?;
            }
        }
        placement
    };
    Ok(Planned {
        placement,
        offload: Some(Offload {
            device: name,
            n_layers: n,
            on_device: k,
            head_on_device: head,
            weights_device,
            weights_host: total - weights_device,
            cache_type: cfg.cache_type,
            budget,
            reason,
            op_offload,
            costs,
        }),
        budget: budget.map(|b| (device, b as usize)),
    })
}

/// Why `auto` under `--offload-head` stopped at the output head and `k` blocks (or left the
/// embedding on the host), with the figures.
fn head_first_reason(costs: &BlockCosts, k: usize, budget: u64, source: &str) -> String {
    let n = costs.weights.len();
    let more = if k < n {
        format!("block {k} needs {} more", size_text(costs.block(k)))
    } else {
        format!(
            "the embedding needs {} more",
            size_text(costs.edges - costs.output)
        )
    };
    format!(
        "a budget of {} ({source}) holds the output head and {k} of {n} blocks: they and {} \
         take {}, {more}",
        size_text(budget),
        reserve_words(costs, k),
        size_text(costs.budget_for_head_first(k, false))
    )
}

/// What is charged beside `k` blocks, in words.
fn reserve_words(costs: &BlockCosts, k: usize) -> String {
    if k < costs.weights.len() && costs.stream > 0 {
        format!(
            "the reserve for activations, the pool and one split's streamed weights ({})",
            size_text(costs.stream)
        )
    } else {
        "the reserve for activations and the pool".into()
    }
}

/// Why `auto` stopped at `k` blocks (or left the head on the host), with the figures.
fn fit_reason(costs: &BlockCosts, k: usize, budget: u64, source: &str) -> String {
    let n = costs.weights.len();
    let reserve = reserve_words(costs, k);
    let taken = if k == 0 {
        format!("{reserve} takes {}", size_text(costs.budget_for(0, false)))
    } else {
        format!(
            "blocks 0..{k} and {reserve} take {}",
            size_text(costs.budget_for(k, false))
        )
    };
    let more = if k < n {
        format!("block {k} needs {} more", size_text(costs.block(k)))
    } else {
        format!(
            "the embedding and output head need {} more",
            size_text(costs.edges)
        )
    };
    let tail = if k == 0 {
        "; every block runs on the CPU"
    } else {
        ""
    };
    format!(
        "a budget of {} ({source}) holds {k} of {n} blocks: {taken}, {more}{tail}",
        size_text(budget)
    )
}

#[cfg(test)]
mod tests {
    use super::BlockCosts;

    fn costs(stream: u64) -> BlockCosts {
        BlockCosts {
            weights: vec![100; 4],
            concat: vec![0; 4],
            kv: 0,
            edges: 30,
            output: 20,
            reserve: 50,
            stream,
        }
    }

    /// The stream arena is charged only beside a plan that leaves a block on the CPU: every
    /// block fits beside the reserve alone; one byte less and the arena's 100 bytes cost a
    /// second block. Control: without the arena the same budget keeps three.
    #[test]
    fn the_stream_arena_is_charged_when_a_block_stays_on_the_cpu() {
        let c = costs(100);
        assert_eq!(c.fit(450), (4, false));
        assert_eq!(c.fit(480), (4, true));
        assert_eq!(c.fit(449), (2, false));
        assert_eq!(c.budget_for(2, false), 350);
        assert_eq!(c.fit(350), (2, false));
        assert_eq!(c.fit(349), (1, false));
        assert_eq!(c.budget_for(4, true), 480);
        assert_eq!(costs(0).fit(449), (3, false));
        // The head first: 50 + 20 + 400 holds every block; one byte less, two.
        assert_eq!(c.fit_head_first(470), Some((4, false)));
        assert_eq!(c.fit_head_first(469), Some((2, false)));
        assert_eq!(c.budget_for_head_first(2, false), 370);
        assert_eq!(costs(0).fit_head_first(469), Some((3, false)));
    }
}
