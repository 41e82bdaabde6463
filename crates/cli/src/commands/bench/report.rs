//! Benchmark rows and their output as a markdown table (llama-bench's columns plus the median
//! and the weight bandwidth), CSV or JSON.

use super::membw::MemBw;
use super::stats;
use super::sysinfo::SysInfo;
use super::Test;
use minfer_gguf::GgufModel;
use std::io::Write;
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Md,
    Csv,
    Json,
}

/// What a row says about the model.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelFacts {
    pub filename: String,
    /// `ARCH FTYPE`, e.g. `qwen2 Q4_K - Medium`.
    pub model_type: String,
    /// Bytes of all tensors.
    pub model_size: u64,
    pub model_n_params: u64,
    /// Rows of the token embedding table.
    pub vocab: usize,
    /// Weight bytes one decode step reads: every tensor but the embedding table, of which
    /// it reads one row, unless the table is also the output head (tied weights).
    pub weight_bytes_per_token: u64,
}

/// llama.cpp's names of `general.file_type` values (the "mostly" type of a file).
fn ftype_name(ft: u64) -> String {
    let s = match ft {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        32 => "BF16",
        other => return format!("ftype {other}"),
    };
    s.to_string()
}

pub fn model_facts(model: &GgufModel, path: &Path) -> ModelFacts {
    let md = model.metadata();
    let arch = md.get_str("general.architecture").unwrap_or("?");
    let ftype = md
        .get_u64("general.file_type")
        .map(ftype_name)
        .unwrap_or_else(|| "ftype ?".into());
    let mut size = 0u64;
    let mut params = 0u64;
    for t in model.tensors() {
        size += t.info.n_bytes;
        params += t.info.n_elements();
    }
    let embd = model.tensor("token_embd.weight");
    let vocab = embd.and_then(|t| t.info.dims.get(1).copied()).unwrap_or(0) as usize;
    let tied = model.tensor("output.weight").is_none();
    let embd_bytes = embd.map(|t| t.info.n_bytes).unwrap_or(0);
    let weight_bytes_per_token = if tied { size } else { size - embd_bytes };
    ModelFacts {
        filename: path.display().to_string(),
        model_type: format!("{arch} {ftype}"),
        model_size: size,
        model_n_params: params,
        vocab,
        weight_bytes_per_token,
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub model_type: String,
    pub model_size: u64,
    pub model_n_params: u64,
    pub backend: String,
    pub n_threads: usize,
    pub type_kv: String,
    pub test: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    /// Tokens in the KV cache before the test (`-d`).
    pub n_depth: usize,
    pub samples_ns: Vec<u64>,
    pub samples_ts: Vec<f64>,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub median_ts: f64,
    /// tg only: weight bytes per token x median tok/s, in GB/s (1e9 bytes).
    pub weight_gbps: Option<f64>,
}

impl Row {
    pub fn new(
        f: &ModelFacts,
        backend: &str,
        threads: usize,
        type_kv: &str,
        test: Test,
        samples_ns: Vec<u64>,
    ) -> Row {
        let n = test.n_tokens() as f64;
        let samples_ts: Vec<f64> = samples_ns.iter().map(|&ns| n * 1e9 / ns as f64).collect();
        let median_ts = stats::median(&samples_ts);
        let (n_prompt, n_gen, weight_gbps) = match test {
            Test::Prompt(p) => (p, 0, None),
            Test::Gen(g) => (
                0,
                g,
                Some(f.weight_bytes_per_token as f64 * median_ts / 1e9),
            ),
        };
        Row {
            model_type: f.model_type.clone(),
            model_size: f.model_size,
            model_n_params: f.model_n_params,
            backend: backend.to_string(),
            n_threads: threads,
            type_kv: type_kv.to_string(),
            test: test.name(),
            n_prompt,
            n_gen,
            n_depth: 0,
            avg_ts: stats::mean(&samples_ts),
            stddev_ts: stats::stdev(&samples_ts),
            median_ts,
            samples_ns,
            samples_ts,
            weight_gbps,
        }
    }

    /// The row of a test run after `depth` cached tokens (named as llama-bench does).
    pub fn at_depth(mut self, depth: usize) -> Row {
        self.n_depth = depth;
        self.test.push_str(&super::depth_suffix(depth));
        self
    }
}

/// llama-bench's size column: MiB below 1 GiB, GiB above.
pub(super) fn size_text(bytes: u64) -> String {
    let mib = bytes as f64 / (1u64 << 20) as f64;
    if mib < 1024.0 {
        format!("{mib:.2} MiB")
    } else {
        format!("{:.2} GiB", mib / 1024.0)
    }
}

fn params_text(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2} B", n as f64 / 1e9)
    } else {
        format!("{:.2} M", n as f64 / 1e6)
    }
}

pub(super) fn write_header(
    out: &mut dyn Write,
    sys: &SysInfo,
    bws: &[MemBw],
) -> std::io::Result<()> {
    writeln!(
        out,
        "minfer {} ({}); CPU: {} ({} logical); SIMD at run time: {}; kernels: {}; compiled for: {}",
        sys.version,
        sys.build_profile,
        sys.cpu,
        sys.logical_cpus,
        sys.cpu_simd.join(" "),
        sys.cpu_kernels,
        if sys.build_target_features.is_empty() {
            "baseline".to_string()
        } else {
            sys.build_target_features.join(" ")
        }
    )?;
    for b in bws {
        writeln!(
            out,
            "memory bandwidth, {} thread(s), {} MiB buffers, best of {}: copy {:.2} GB/s, read {:.2} GB/s",
            b.threads,
            b.bytes >> 20,
            b.rounds,
            b.copy_gbps,
            b.read_gbps
        )?;
    }
    Ok(())
}

pub fn write(
    out: &mut dyn Write,
    format: Format,
    sys: &SysInfo,
    facts: Option<&ModelFacts>,
    bws: &[MemBw],
    rows: &[Row],
    kv_note: Option<&str>,
) -> std::io::Result<()> {
    match format {
        Format::Md => {
            write_header(out, sys, bws)?;
            if let Some(f) = facts {
                writeln!(
                    out,
                    "model: {} ({} weight bytes read per generated token)",
                    f.filename, f.weight_bytes_per_token
                )?;
            }
            if let (Some(n), false) = (kv_note, rows.is_empty()) {
                writeln!(out, "{n}")?;
            }
            if rows.is_empty() {
                return Ok(());
            }
            writeln!(out)?;
            writeln!(out, "| model | size | params | backend | threads | type_kv | test | t/s | median t/s | weights GB/s |")?;
            writeln!(
                out,
                "| --- | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |"
            )?;
            for r in rows {
                let gbps = r
                    .weight_gbps
                    .map(|g| format!("{g:.2}"))
                    .unwrap_or_else(|| "-".into());
                writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {:.2} ± {:.2} | {:.2} | {} |",
                    r.model_type,
                    size_text(r.model_size),
                    params_text(r.model_n_params),
                    r.backend,
                    r.n_threads,
                    r.type_kv,
                    r.test,
                    r.avg_ts,
                    r.stddev_ts,
                    r.median_ts,
                    gbps
                )?;
            }
        }
        Format::Csv => {
            writeln!(out, "model_type,model_size,model_n_params,backend,n_threads,type_kv,test,n_prompt,n_gen,n_depth,avg_ts,stddev_ts,median_ts,weight_gbps")?;
            for r in rows {
                writeln!(
                    out,
                    "\"{}\",{},{},{},{},{},{},{},{},{},{:.4},{:.4},{:.4},{}",
                    r.model_type,
                    r.model_size,
                    r.model_n_params,
                    r.backend,
                    r.n_threads,
                    r.type_kv,
                    r.test,
                    r.n_prompt,
                    r.n_gen,
                    r.n_depth,
                    r.avg_ts,
                    r.stddev_ts,
                    r.median_ts,
                    r.weight_gbps.map(|g| format!("{g:.4}")).unwrap_or_default()
                )?;
            }
        }
        Format::Json => write_json(out, sys, facts, bws, rows)?,
    }
    Ok(())
}

/// The JSON document both bench reports print: system, model, memory bandwidths, rows.
pub(super) fn write_json<R: serde::Serialize>(
    out: &mut dyn Write,
    sys: &SysInfo,
    facts: Option<&ModelFacts>,
    bws: &[MemBw],
    rows: &[R],
) -> std::io::Result<()> {
    let doc = serde_json::json!({
        "system": sys,
        "model": facts,
        "membw": bws,
        "results": rows,
    });
    let text = serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)?;
    writeln!(out, "{text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> ModelFacts {
        ModelFacts {
            filename: "m.gguf".into(),
            model_type: "qwen2 Q4_K - Medium".into(),
            model_size: 2 << 30,
            model_n_params: 494_032_768,
            vocab: 100,
            weight_bytes_per_token: 400_000_000,
        }
    }

    #[test]
    fn tg_row_reports_tokens_per_second_and_weight_bandwidth() {
        // 128 tokens in 2 s, 1 s and 4 s: 64, 128, 32 tok/s; median 64; 0.4 GB x 64 = 25.6.
        let ns = vec![2_000_000_000, 1_000_000_000, 4_000_000_000];
        let r = Row::new(&facts(), "CPU", 2, "f16", Test::Gen(128), ns);
        assert_eq!(r.samples_ts, vec![64.0, 128.0, 32.0]);
        assert_eq!(r.median_ts, 64.0);
        assert!((r.weight_gbps.unwrap() - 25.6).abs() < 1e-9);
        let pp = Row::new(
            &facts(),
            "CPU",
            2,
            "f16",
            Test::Prompt(512),
            vec![1_000_000_000],
        );
        assert_eq!((pp.n_prompt, pp.n_gen, pp.weight_gbps), (512, 0, None));
        assert_eq!(pp.median_ts, 512.0);
    }

    #[test]
    fn markdown_row_has_llama_bench_columns() {
        let r = Row::new(
            &facts(),
            "CPU",
            2,
            "f16",
            Test::Gen(128),
            vec![1_000_000_000],
        );
        let sys = super::super::sysinfo::detect();
        let mut buf = Vec::new();
        write(&mut buf, Format::Md, &sys, Some(&facts()), &[], &[r], None).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(
            text.contains("| qwen2 Q4_K - Medium | 2.00 GiB | 494.03 M | CPU | 2 | f16 | tg128 | 128.00 ± 0.00 | 128.00 | 51.20 |"),
            "{text}"
        );
    }
}
