//! The layer-offload flags (issue 32) of every command that takes `--backend`: how many
//! blocks go on the device backend, the device budget `auto` fits them into, and the lines
//! that say what the engine took.

use clap::Args as ClapArgs;
use minfer_engine::{parse_size, Engine, EngineConfig, GpuLayers};

#[derive(ClapArgs, Debug, Clone, Default)]
pub struct OffloadArgs {
    /// Blocks on the device backend (llama.cpp's -ngl / --n-gpu-layers): N puts blocks 0..N
    /// on the device and the rest on the CPU (N past the model's blocks is clamped to them,
    /// as llama.cpp does; the embedding and output head go on the device only when every
    /// block does); auto fits the most blocks into --gpu-mem, else the device's free memory,
    /// less a reserve for activations [default with a device backend: auto].
    #[arg(long = "gpu-layers", visible_alias = "n-gpu-layers", value_name = "N|auto",
          value_parser = gpu_layers_value)]
    pub gpu_layers: Option<GpuLayers>,
    /// Device memory --gpu-layers auto fits blocks (their weights and KV) into, and the
    /// limit every device allocation is checked against: bytes or K/M/G/T, e.g. 3G, 512M
    /// [default: the device's free memory].
    #[arg(long = "gpu-mem", value_name = "SIZE", value_parser = size_value)]
    pub gpu_mem: Option<usize>,
    /// Also put the final norm and output head on the device when only some blocks are
    /// there (with every block they always are). llama.cpp's -ngl counts its output layer as
    /// one of the N and offloads it first: its -ngl N holds what --gpu-layers N-1
    /// --offload-head holds here. With auto, the head is fitted first.
    #[arg(long = "offload-head")]
    pub offload_head: bool,
    /// Keep the prompt rows of the CPU's blocks on the CPU (llama.cpp's --no-op-offload). By
    /// default, when some blocks run on the CPU, the device runs their prompt rows (all but
    /// attention, which reads the KV on the CPU), the weights copied in per forward;
    /// generation rows stay on the CPU.
    #[arg(long = "no-op-offload", visible_alias = "nopo")]
    pub no_op_offload: bool,
}

fn gpu_layers_value(s: &str) -> Result<GpuLayers, String> {
    GpuLayers::parse(s)
}

fn size_value(s: &str) -> Result<usize, String> {
    parse_size(s)
}

impl OffloadArgs {
    /// The flags' part of an engine's configuration.
    pub fn apply(&self, cfg: &mut EngineConfig) {
        if let Some(n) = self.gpu_layers {
            cfg.gpu_layers = n;
        }
        cfg.gpu_mem = self.gpu_mem;
        cfg.offload_head = self.offload_head;
        cfg.op_offload = !self.no_op_offload;
    }

    /// The startup line of the plan the engine took (and why `auto` placed fewer than every
    /// block); a flag that had no device to act on says so.
    pub fn report(&self, engine: &Engine) {
        match engine.offload() {
            Some(o) => {
                eprintln!("{}", o.line());
                if let Some(why) = &o.reason {
                    eprintln!("note: offload: {why}");
                }
            }
            None if self.gpu_layers.is_some() || self.gpu_mem.is_some() || self.offload_head => {
                eprintln!(
                    "note: --gpu-layers/--gpu-mem/--offload-head: no device backend holds the \
                     model's blocks; every block runs on the cpu"
                )
            }
            None => {}
        }
    }
}
