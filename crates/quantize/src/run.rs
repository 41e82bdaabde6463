//! The quantize driver: open, plan every tensor's type, then stream the new file.

use crate::ftype::{is_quantized, Ftype};
use crate::imatrix::Imatrix;
use crate::recipe::{Fallback, ModelFacts, Planner, TypeRules};
use crate::split_output::{self, OutputPart};
use crate::{layer_number, Error, Result};
use minfer_gguf::quants::{dequantize_row, quantize_row, quantize_row_imatrix};
use minfer_gguf::writer::TensorPlan;
use minfer_gguf::{stage_streaming, GgmlType, GgufModel, Metadata, Value};
use regex::Regex;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What to write; [`Options::new`] gives llama-quantize's defaults.
#[derive(Clone, Debug)]
pub struct Options {
    pub ftype: Ftype,
    pub pure: bool,
    pub output_tensor_type: Option<GgmlType>,
    pub token_embedding_type: Option<GgmlType>,
    /// `PATTERN=TYPE` overrides: regexes searched in tensor names (lowercased, as
    /// llama-quantize lowercases them), first match wins.
    pub tensor_types: Vec<(String, GgmlType)>,
    /// Dequantize quantized source tensors first instead of refusing them.
    pub allow_requantize: bool,
    /// Keep output.weight in its source type.
    pub leave_output_tensor: bool,
    /// Worker threads (0: all cores).
    pub threads: usize,
    /// Importance matrix (already filtered by `--include-weights`/`--exclude-weights`);
    /// one with no entries counts as none, as in llama-quantize.
    pub imatrix: Option<Imatrix>,
    /// Write a split set with the input's parts (llama-quantize's `--keep-split`): the
    /// output path is the prefix of the parts' names.
    pub keep_split: bool,
}

impl Options {
    pub fn new(ftype: Ftype) -> Self {
        Options {
            ftype,
            pure: false,
            output_tensor_type: None,
            token_embedding_type: None,
            tensor_types: Vec::new(),
            allow_requantize: false,
            leave_output_tensor: false,
            threads: 0,
            imatrix: None,
            keep_split: false,
        }
    }
}

/// Progress reports, in order.
#[derive(Clone, Debug)]
pub enum Event {
    /// The plan is made: how many tensors and bytes of tensor data will be written.
    Planned { tensors: usize, bytes_in: u64 },
    /// A tensor whose row length is not whole blocks of its type got another type.
    Fallback(Fallback),
    /// A tensor is quantized without importance weights: the imatrix has no entry for it.
    ImatrixMissing { tensor: String },
    /// The token embedding's imatrix entry does not fit it (as usual: llama-imatrix sees
    /// it as a lookup, not a matrix product), so it is quantized without one.
    ImatrixIgnored {
        tensor: String,
        got: usize,
        want: usize,
    },
    /// A quantized tensor is being dequantized and quantized again.
    Requantize { tensor: String, from: GgmlType },
    /// A tensor is written.
    Tensor {
        index: usize,
        name: String,
        from: GgmlType,
        to: GgmlType,
        bytes_in: u64,
        bytes_out: u64,
    },
}

/// Totals of a finished run.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub tensors: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub fallbacks: usize,
    /// The files written, in order: one, or the parts of a `keep_split` set.
    pub outputs: Vec<PathBuf>,
}

/// The tensor order llama-quantize writes: by layer number (tensors outside `blk.N.` first,
/// as layer -1), then by name (the order of llama.cpp's `weights_map`).
pub fn tensor_order<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = names.into_iter().collect();
    v.sort_by(|a, b| {
        let la = layer_number(a).unwrap_or(-1);
        let lb = layer_number(b).unwrap_or(-1);
        la.cmp(&lb).then_with(|| a.cmp(b))
    });
    v
}

/// The recipe facts from the model's metadata.
fn model_facts(md: &Metadata) -> ModelFacts {
    let arch = md.get_str("general.architecture").unwrap_or("").to_string();
    let key = |k: &str| format!("{arch}.{k}");
    // head_count_kv may be a per-layer array; llama.cpp's n_gqa() looks at layer 0.
    let first = |k: &str| -> Option<u64> {
        match md.get(&key(k))? {
            Value::Array(a) if !a.is_empty() => a.item_to_string(0).parse().ok(),
            v => v.as_u64(),
        }
    };
    let n_layer = md.get_u64(&key("block_count")).unwrap_or(0) as usize;
    let n_head = first("attention.head_count").unwrap_or(0) as usize;
    let n_head_kv = first("attention.head_count_kv").unwrap_or(n_head as u64) as usize;
    ModelFacts {
        n_gqa: n_head.checked_div(n_head_kv).unwrap_or(0),
        n_expert: md.get_u64(&key("expert_count")).unwrap_or(0) as usize,
        is_70b: matches!(arch.as_str(), "llama" | "qwen2") && n_layer == 80,
        n_layer,
        arch,
    }
}

/// The types minfer can write a tensor in.
fn check_target(what: &str, ty: GgmlType) -> Result<GgmlType> {
    if ty.is_supported() && ty != GgmlType::Q8_1 && ty != GgmlType::Q8K {
        Ok(ty)
    } else {
        Err(Error::TargetType {
            what: what.to_string(),
            ty,
        })
    }
}

/// llama-quantize passes its imatrix keys as 128-byte C strings: at most 127 bytes survive.
fn c_string_127(s: &str) -> String {
    let mut end = s.len().min(127);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The output metadata: the input's keys in order, `split.*` removed, then
/// `general.quantization_version` = 2 and `general.file_type` appended, then with an
/// imatrix `quantize.imatrix.file`, `.dataset` (when the file names one), `.entries_count`
/// and `.chunks_count` (when known), each removed first and appended as llama.cpp's gguf
/// sets a key.
fn output_metadata(src: &Metadata, ftype: Ftype, imatrix: Option<&Imatrix>) -> Metadata {
    let mut md = src.clone();
    for k in [
        "general.quantization_version",
        "general.file_type",
        "split.no",
        "split.count",
        "split.tensors.count",
    ] {
        md.remove(k);
    }
    md.set("general.quantization_version", Value::U32(2));
    md.set("general.file_type", Value::U32(ftype.id()));
    if let Some(im) = imatrix {
        let mut put = |k: &str, v: Value| {
            md.remove(k);
            md.set(k, v);
        };
        put(
            "quantize.imatrix.file",
            Value::String(c_string_127(&im.file)),
        );
        if let Some(d) = im.datasets.first() {
            put("quantize.imatrix.dataset", Value::String(c_string_127(d)));
        }
        put(
            "quantize.imatrix.entries_count",
            Value::U32(im.entries.len() as u32),
        );
        if im.chunk_count > 0 {
            put("quantize.imatrix.chunks_count", Value::U32(im.chunk_count));
        }
    }
    md
}

/// The importance weights for a tensor about to be quantized, as llama-quantize picks
/// them: the entry of the same name, whose length must be ne0 x ne2 (columns x experts);
/// none when there is no entry, or for a token embedding whose entry does not fit.
fn weights_for<'a>(
    imatrix: Option<&'a Imatrix>,
    name: &str,
    dims: &[u64],
    on_event: &mut dyn FnMut(Event),
) -> Result<Option<&'a [f32]>> {
    let Some(im) = imatrix else {
        return Ok(None);
    };
    let Some(w) = im.entries.get(name) else {
        on_event(Event::ImatrixMissing {
            tensor: name.to_string(),
        });
        return Ok(None);
    };
    let want = (dims[0] * dims.get(2).copied().unwrap_or(1)) as usize;
    if w.len() == want {
        return Ok(Some(w));
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        on_event(Event::ImatrixIgnored {
            tensor: name.to_string(),
            got: w.len(),
            want,
        });
        return Ok(None);
    }
    Err(Error::ImatrixSize {
        tensor: name.to_string(),
        got: w.len(),
        want,
    })
}

/// Quantizes `input` (one file or a split set) into `output`, written atomically; with
/// `keep_split`, into the parts `OUTPUT-0000k-of-0000n.gguf` (`OUTPUT` without its `.gguf`),
/// each written atomically and all renamed into place only once every part is complete.
///
/// # Errors
/// Unknown or unwritable target types, bad `--tensor-type` patterns, quantized sources
/// without `allow_requantize`, and any read or write failure; the partial output is removed.
pub fn quantize_model(
    input: &Path,
    output: &Path,
    opts: &Options,
    on_event: &mut dyn FnMut(Event),
) -> Result<Summary> {
    let model = GgufModel::open(input)?;
    let imatrix = opts.imatrix.as_ref().filter(|m| !m.entries.is_empty());
    if let Some(m) = imatrix {
        m.check_finite()?;
    }
    for (what, t) in [
        ("--output-tensor-type", opts.output_tensor_type),
        ("--token-embedding-type", opts.token_embedding_type),
    ] {
        if let Some(t) = t {
            check_target(what, t)?;
        }
    }
    let mut tensor_types = Vec::with_capacity(opts.tensor_types.len());
    for (pattern, ty) in &opts.tensor_types {
        check_target(&format!("--tensor-type {pattern}"), *ty)?;
        let re = Regex::new(&pattern.to_lowercase()).map_err(|source| Error::Pattern {
            pattern: pattern.clone(),
            source,
        })?;
        tensor_types.push((re, *ty));
    }
    let rules = TypeRules {
        ftype: opts.ftype,
        pure: opts.pure,
        output_tensor_type: opts.output_tensor_type,
        token_embedding_type: opts.token_embedding_type,
        tensor_types,
        leave_output_tensor: opts.leave_output_tensor,
        has_imatrix: imatrix.is_some(),
    };
    // llama-quantize visits the tensors in its map order, or in file order with
    // --keep-split; the order decides the attn_v counter of the mixture rules, too.
    let (order, part_of): (Vec<&str>, Vec<usize>) = if opts.keep_split {
        split_output::file_order(&model).into_iter().unzip()
    } else {
        let names = model.tensors().iter().map(|t| t.info.name.as_str());
        let order = tensor_order(names);
        let n = order.len();
        (order, vec![0; n])
    };
    let mut planner = Planner::new(&rules, model_facts(model.metadata()), order.iter().copied());
    let mut plan = Vec::with_capacity(order.len());
    for name in &order {
        let (info, _) = model.tensor_data(name)?;
        let ty = planner.plan(name, &info.dims, info.ty)?;
        if ty != info.ty && is_quantized(info.ty) && !opts.allow_requantize {
            return Err(Error::Requantize {
                tensor: name.to_string(),
                ty: info.ty,
            });
        }
        plan.push(TensorPlan {
            name: name.to_string(),
            dims: info.dims.clone(),
            ty,
        });
    }
    // Entry sizes are checked before anything is written (llama-quantize stops midway).
    let mut weights = Vec::with_capacity(plan.len());
    let mut imatrix_events = Vec::new();
    for t in &plan {
        let (info, _) = model.tensor_data(&t.name)?;
        let w = if t.ty == info.ty {
            None
        } else {
            weights_for(imatrix, &t.name, &t.dims, &mut |e| imatrix_events.push(e))?
        };
        weights.push(w);
    }
    let fallbacks = std::mem::take(&mut planner.fallbacks);
    let bytes_in: u64 = order
        .iter()
        .map(|n| model.tensor(n).map_or(0, |t| t.info.n_bytes))
        .sum();
    on_event(Event::Planned {
        tensors: plan.len(),
        bytes_in,
    });
    let n_fallbacks = fallbacks.len();
    for f in fallbacks {
        on_event(Event::Fallback(f));
    }
    for e in imatrix_events {
        on_event(e);
    }
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let metadata = output_metadata(model.metadata(), opts.ftype, imatrix);
    let parts = if opts.keep_split {
        split_output::layout(output, metadata, &part_of, model.parts().len())?
    } else {
        vec![OutputPart {
            path: output.to_path_buf(),
            metadata,
            tensors: 0..plan.len(),
        }]
    };
    let mut bytes_out = 0u64;
    let mut produce = |i: usize, out: &mut dyn Write| -> Result<()> {
        let t = &plan[i];
        let (info, src) = model.tensor_data(&t.name)?;
        let n = if t.ty == info.ty {
            write_all(out, src, output)?;
            src.len() as u64
        } else {
            if is_quantized(info.ty) {
                on_event(Event::Requantize {
                    tensor: t.name.clone(),
                    from: info.ty,
                });
            }
            convert(info.ty, src, t, weights[i], threads, out, output)?
        };
        bytes_out += n;
        on_event(Event::Tensor {
            index: i,
            name: t.name.clone(),
            from: info.ty,
            to: t.ty,
            bytes_in: src.len() as u64,
            bytes_out: n,
        });
        Ok(())
    };
    write_parts(&parts, &plan, &mut produce)?;
    Ok(Summary {
        tensors: plan.len(),
        bytes_in,
        bytes_out,
        fallbacks: n_fallbacks,
        outputs: parts.into_iter().map(|p| p.path).collect(),
    })
}

/// Writes the parts crash-safely (`minfer_gguf::atomic`): each to its fsynced temporary,
/// then all renamed, so that a failure (or a kill before the renames) leaves no new part
/// and every old file intact.
fn write_parts(
    parts: &[OutputPart],
    plan: &[TensorPlan],
    produce: &mut dyn FnMut(usize, &mut dyn Write) -> Result<()>,
) -> Result<()> {
    let mut staged = Vec::with_capacity(parts.len());
    for p in parts {
        let r = p.tensors.clone();
        // A failed part drops the staged ones before it, which removes their temporaries.
        staged.push(stage_streaming::<Error, _>(
            &p.metadata,
            &plan[r.clone()],
            &p.path,
            |j, out| produce(r.start + j, out),
        )?);
    }
    minfer_gguf::atomic::commit_all(staged)?;
    Ok(())
}

fn write_all(out: &mut dyn Write, bytes: &[u8], path: &Path) -> Result<()> {
    out.write_all(bytes).map_err(|source| Error::Io {
        path: path.into(),
        source,
    })
}

/// Rows per slab: bounds the f32 and output buffers to about 64 MiB of f32.
const SLAB_ELEMENTS: usize = 16 << 20;

/// Converts one tensor's rows from `from` to `t.ty` on `threads` threads, slab by slab, and
/// writes them; returns the bytes written. With `weights` (ncols per expert, experts in
/// order), row r takes expert r / ne1's.
fn convert(
    from: GgmlType,
    src: &[u8],
    t: &TensorPlan,
    weights: Option<&[f32]>,
    threads: usize,
    out: &mut dyn Write,
    path: &Path,
) -> Result<u64> {
    let ncols = t.dims[0] as usize;
    let src_row = from
        .row_bytes(t.dims[0])
        .expect("the reader checked the row") as usize;
    let dst_row =
        t.ty.row_bytes(t.dims[0])
            .expect("the planner picked a type whose blocks divide the row") as usize;
    let nrows = src.len() / src_row;
    let rows_per_expert = t.dims.get(1).copied().unwrap_or(1).max(1) as usize;
    let slab_rows = (SLAB_ELEMENTS / ncols).clamp(1, nrows.max(1));
    let mut written = 0u64;
    let mut f32_buf = vec![0f32; slab_rows * ncols];
    let mut dst = vec![0u8; slab_rows * dst_row];
    for first in (0..nrows).step_by(slab_rows) {
        let rows = slab_rows.min(nrows - first);
        let s = &src[first * src_row..(first + rows) * src_row];
        let x = &mut f32_buf[..rows * ncols];
        let d = &mut dst[..rows * dst_row];
        // Each row is independent in every quantizer, so the split between threads cannot
        // change the bytes.
        let per = rows.div_ceil(threads.max(1));
        std::thread::scope(|scope| -> Result<()> {
            let jobs: Vec<_> = s
                .chunks(per * src_row)
                .zip(x.chunks_mut(per * ncols))
                .zip(d.chunks_mut(per * dst_row))
                .enumerate()
                .map(|(job, ((s, x), d))| {
                    scope.spawn(move || -> minfer_gguf::Result<()> {
                        for (k, ((sr, xr), dr)) in s
                            .chunks(src_row)
                            .zip(x.chunks_mut(ncols))
                            .zip(d.chunks_mut(dst_row))
                            .enumerate()
                        {
                            dequantize_row(from, sr, xr)?;
                            match weights {
                                None => quantize_row(t.ty, xr, dr)?,
                                Some(w) => {
                                    let row = first + job * per + k;
                                    let e = row / rows_per_expert;
                                    let w = &w[e * ncols..(e + 1) * ncols];
                                    quantize_row_imatrix(t.ty, xr, w, dr)?
                                }
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            for j in jobs {
                j.join().expect("a quantize worker panicked")?;
            }
            Ok(())
        })?;
        write_all(out, d, path)?;
        written += d.len() as u64;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_sort_by_layer_then_name() {
        let got = tensor_order([
            "blk.10.attn_q.weight",
            "blk.2.ffn_up.weight",
            "output.weight",
            "blk.2.attn_k.weight",
            "token_embd.weight",
            "output_norm.weight",
        ]);
        assert_eq!(
            got,
            [
                "output.weight",
                "output_norm.weight",
                "token_embd.weight",
                "blk.2.attn_k.weight",
                "blk.2.ffn_up.weight",
                "blk.10.attn_q.weight",
            ]
        );
    }

    #[test]
    fn quantization_keys_move_to_the_end() {
        let mut md = Metadata::new();
        md.set("general.file_type", Value::U32(1));
        md.set("general.architecture", Value::String("qwen2".into()));
        md.set("split.count", Value::U16(1));
        let out = output_metadata(&md, Ftype::MostlyQ4KM, None);
        let keys: Vec<&str> = out.iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "general.architecture",
                "general.quantization_version",
                "general.file_type"
            ]
        );
        assert_eq!(out.get_u64("general.file_type"), Some(15));
    }
}
