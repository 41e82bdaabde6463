//! Which type each tensor gets: llama-quantize's rules (`llama_tensor_get_type` in
//! llama.cpp's `src/llama-quant.cpp`) for the file types minfer writes.
//!
//! The rules are stateful: attention-V and FFN tensors are counted in file order, and
//! "use more bits" picks layers by that count. So [`Planner::plan`] must see the tensors in
//! the order llama-quantize walks them ([`crate::tensor_order`]), once each.

use crate::ftype::{is_quantized, Ftype};
use crate::{Error, Result};
use minfer_gguf::GgmlType;
use regex::Regex;

/// The broad role of a tensor, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    Output,
    TokenEmbd,
    AttnQkv,
    AttnKvB,
    AttnV,
    AttnK,
    AttnQ,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

impl Category {
    pub fn of(name: &str) -> Category {
        use Category::*;
        if name == "output.weight" {
            return Output;
        }
        if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
            return TokenEmbd;
        }
        // First match wins, in this order (a name can contain several of these).
        let table = [
            ("attn_qkv.weight", AttnQkv),
            ("attn_kv_b.weight", AttnKvB),
            ("attn_v.weight", AttnV),
            ("attn_k.weight", AttnK),
            ("attn_q.weight", AttnQ),
            ("attn_output.weight", AttnOutput),
            ("ffn_up", FfnUp),
            ("ffn_gate", FfnGate),
            ("ffn_down", FfnDown),
        ];
        table
            .into_iter()
            .find(|(needle, _)| name.contains(needle))
            .map_or(Other, |(_, c)| c)
    }

    /// The attention-V-like tensors the recipes treat as most sensitive.
    fn is_attn_v(self) -> bool {
        matches!(
            self,
            Category::AttnV | Category::AttnQkv | Category::AttnKvB
        )
    }
}

/// The model facts the recipes look at.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelFacts {
    pub arch: String,
    pub n_layer: usize,
    /// head_count / head_count_kv of layer 0 (0 when head_count_kv is 0).
    pub n_gqa: usize,
    pub n_expert: usize,
    /// llama.cpp calls this model size "70B" (80 layers of llama or qwen2).
    pub is_70b: bool,
}

/// What a user asked for, as far as type choice goes.
#[derive(Clone, Debug)]
pub struct TypeRules {
    pub ftype: Ftype,
    /// One type for every quantizable tensor (no mixture rules).
    pub pure: bool,
    pub output_tensor_type: Option<GgmlType>,
    pub token_embedding_type: Option<GgmlType>,
    /// `--tensor-type PATTERN=TYPE`, patterns lowercased, first match wins.
    pub tensor_types: Vec<(Regex, GgmlType)>,
    /// Keep output.weight in its source type.
    pub leave_output_tensor: bool,
    pub has_imatrix: bool,
}

/// A tensor demoted because its rows are not whole blocks of the chosen type.
#[derive(Clone, Debug, PartialEq)]
pub struct Fallback {
    pub tensor: String,
    pub ncols: u64,
    pub wanted: GgmlType,
    pub got: GgmlType,
}

/// Walks the tensors in llama-quantize's order and picks each one's type.
pub struct Planner<'a> {
    rules: &'a TypeRules,
    model: ModelFacts,
    tied_embeddings: bool,
    n_attention_wv: usize,
    i_attention_wv: usize,
    i_ffn_down: usize,
    i_ffn_gate: usize,
    i_ffn_up: usize,
    pub fallbacks: Vec<Fallback>,
}

/// Whether llama-quantize quantizes a tensor at all (2-D or more, a `weight` that is not a
/// norm, gate-input, or one of the small special tables it names).
pub fn allows_quantization(rules: &TypeRules, name: &str, n_dims: usize) -> bool {
    if n_dims < 2 || !name.ends_with("weight") || name.contains("_norm.weight") {
        return false;
    }
    if rules.leave_output_tensor && name == "output.weight" {
        return false;
    }
    const KEEP: &[&str] = &[
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ];
    // Position embeddings and token types (BERT) keep their type too.
    !KEEP.iter().any(|k| name.contains(k))
        && name != "position_embd.weight"
        && name != "token_types.weight"
}

impl<'a> Planner<'a> {
    /// `names` are all tensor names of the model (to count attention-V tensors and see
    /// whether output.weight exists).
    pub fn new<'n>(
        rules: &'a TypeRules,
        model: ModelFacts,
        names: impl IntoIterator<Item = &'n str>,
    ) -> Self {
        let mut tied = true;
        let mut n_attention_wv = 0;
        for n in names {
            let c = Category::of(n);
            n_attention_wv += c.is_attn_v() as usize;
            tied &= c != Category::Output;
        }
        Planner {
            rules,
            model,
            tied_embeddings: tied,
            n_attention_wv,
            i_attention_wv: 0,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
            fallbacks: Vec::new(),
        }
    }

    /// The type of tensor `name` (dims innermost first, source type `src`).
    pub fn plan(&mut self, name: &str, dims: &[u64], src: GgmlType) -> Result<GgmlType> {
        let n_dims = dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
        let r = self.rules;
        if !allows_quantization(r, name, n_dims) {
            return Ok(src);
        }
        let cat = Category::of(name);
        if let (Some(t), Category::TokenEmbd) = (r.token_embedding_type, cat) {
            // per_layer_token_embd yields to an explicit --tensor-type naming it.
            let named = name == "per_layer_token_embd.weight"
                && r.tensor_types.iter().any(|(re, _)| re.is_match(name));
            if !named {
                return Ok(t);
            }
        }
        if let (Some(t), Category::Output) = (r.output_tensor_type, cat) {
            return Ok(t);
        }
        let mut ty = r.ftype.default_type();
        if !is_quantized(ty) {
            return Ok(ty);
        }
        let manual = r.tensor_types.iter().find(|(re, _)| re.is_match(name));
        if let Some((_, t)) = manual {
            ty = *t;
        } else if !r.pure {
            ty = self.mixture_type(ty, name, dims[0], cat)?;
        }
        Ok(self.fallback(name, dims[0], ty))
    }

    /// Demotes a type whose block does not divide the row length (`tensor_type_fallback`).
    fn fallback(&mut self, name: &str, ncols: u64, ty: GgmlType) -> GgmlType {
        if ncols.is_multiple_of(ty.block_size()) {
            return ty;
        }
        use GgmlType as T;
        let mut got = match ty {
            T::Iq4Xs => T::Iq4Nl,
            T::Q2K | T::Q3K => T::Q4_0,
            T::Q4K => T::Q5_0,
            T::Q5K => T::Q5_1,
            T::Q6K => T::Q8_0,
            other => other,
        };
        if !ncols.is_multiple_of(got.block_size()) {
            got = T::F16;
        }
        self.fallbacks.push(Fallback {
            tensor: name.to_string(),
            ncols,
            wanted: ty,
            got,
        });
        got
    }

    /// `use_more_bits`: the first and last eighth of the layers and every third in between.
    fn use_more_bits(i: usize, n: usize) -> bool {
        let (i, n) = (i as i64, n as i64);
        i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
    }

    /// The layer of an FFN tensor: its running count, or for expert models the number in
    /// its `blk.N.` name.
    fn layer_of(&self, counter: usize, name: &str) -> Result<(usize, usize)> {
        let n = self.model.n_layer;
        if self.model.n_expert <= 1 {
            return Ok((counter, n));
        }
        let layer = crate::layer_number(name)
            .filter(|&l| l >= 0 && (l as usize) < n)
            .ok_or_else(|| Error::Recipe(format!("cannot tell the layer of tensor {name}")))?;
        Ok((layer as usize, n))
    }

    /// The mixture rules proper (`llama_tensor_get_type_impl`), for the file types minfer
    /// writes; branches for the IQ1/IQ2/IQ3 and MXFP4 types are absent with those types.
    fn mixture_type(
        &mut self,
        mut ty: GgmlType,
        name: &str,
        ncols: u64,
        cat: Category,
    ) -> Result<GgmlType> {
        use Category as C;
        use Ftype as F;
        use GgmlType as T;
        let ftype = self.rules.ftype;
        let m = &self.model;
        let falcon = m.arch == "falcon";
        if cat == C::Output || (self.tied_embeddings && cat == C::TokenEmbd) {
            if let Some(t) = self.rules.output_tensor_type {
                return Ok(t);
            }
            if falcon || !ncols.is_multiple_of(ty.block_size()) {
                return Ok(T::Q8_0);
            }
            return Ok(if ty != T::Q8_0 { T::Q6K } else { ty });
        }
        if cat == C::TokenEmbd {
            return Ok(self.rules.token_embedding_type.unwrap_or(ty));
        }
        if cat.is_attn_v() {
            let gqa4 = m.n_gqa >= 4;
            match ftype {
                F::MostlyQ2K => ty = if gqa4 { T::Q4K } else { T::Q3K },
                F::MostlyQ3KM => {
                    ty = if self.i_attention_wv < 2 {
                        T::Q5K
                    } else {
                        T::Q4K
                    }
                }
                F::MostlyQ3KL => ty = T::Q5K,
                F::MostlyIq4Nl | F::MostlyIq4Xs if gqa4 => ty = T::Q5K,
                F::MostlyQ4KM | F::MostlyQ5KM
                    if Self::use_more_bits(self.i_attention_wv, self.n_attention_wv) =>
                {
                    ty = T::Q6K
                }
                F::MostlyQ4KS if self.i_attention_wv < 4 => ty = T::Q5K,
                _ => {}
            }
            if m.is_70b && matches!(ty, T::Q3K | T::Q4K) {
                ty = T::Q5K;
            }
            if m.n_expert == 8 {
                ty = T::Q8_0;
            }
            self.i_attention_wv += 1;
            return Ok(ty);
        }
        match cat {
            C::AttnK if m.n_expert == 8 => ty = T::Q8_0,
            C::FfnDown => {
                let (i, n) = self.layer_of(self.i_ffn_down, name)?;
                let imatrix = self.rules.has_imatrix;
                match ftype {
                    F::MostlyQ2K => ty = T::Q3K,
                    F::MostlyQ3KM => {
                        ty = if i < n / 16 {
                            T::Q5K
                        } else if !falcon || Self::use_more_bits(i, n) {
                            T::Q4K
                        } else {
                            T::Q3K
                        }
                    }
                    F::MostlyQ3KL => ty = if falcon { T::Q4K } else { T::Q5K },
                    F::MostlyQ4KM => {
                        if falcon {
                            ty = if i < n / 16 {
                                T::Q6K
                            } else if Self::use_more_bits(i, n) {
                                T::Q5K
                            } else {
                                T::Q4K
                            };
                        } else if Self::use_more_bits(i, n) {
                            ty = T::Q6K;
                        }
                    }
                    F::MostlyIq4Nl | F::MostlyIq4Xs if i < n / 8 && !imatrix => ty = T::Q5K,
                    F::MostlyQ5KM if Self::use_more_bits(i, n) => ty = T::Q6K,
                    F::MostlyQ4KS if !falcon && i < n / 8 => ty = T::Q5K,
                    F::MostlyQ4_0 | F::MostlyQ5_0 if imatrix && i < n / 8 => {
                        ty = if ftype == F::MostlyQ4_0 {
                            T::Q4_1
                        } else {
                            T::Q5_1
                        }
                    }
                    _ => {}
                }
                self.i_ffn_down += 1;
            }
            C::AttnOutput => {
                if !falcon {
                    if m.n_expert == 8 {
                        if matches!(
                            ftype,
                            F::MostlyQ2K
                                | F::MostlyQ3KS
                                | F::MostlyQ3KM
                                | F::MostlyIq4Nl
                                | F::MostlyQ4KS
                                | F::MostlyQ4KM
                                | F::MostlyIq4Xs
                        ) {
                            ty = T::Q5K;
                        }
                    } else {
                        match ftype {
                            F::MostlyQ2K => ty = T::Q3K,
                            F::MostlyQ3KM => ty = T::Q4K,
                            F::MostlyQ3KL => ty = T::Q5K,
                            _ => {}
                        }
                    }
                } else if ftype == F::MostlyQ3KL {
                    ty = T::Q4K;
                }
            }
            C::AttnQkv => match ftype {
                F::MostlyQ3KM | F::MostlyQ3KL => ty = T::Q4K,
                F::MostlyQ4KM => ty = T::Q5K,
                F::MostlyQ5KM => ty = T::Q6K,
                _ => {}
            },
            C::FfnGate => {
                self.layer_of(self.i_ffn_gate, name)?;
                self.i_ffn_gate += 1;
            }
            C::FfnUp => {
                self.layer_of(self.i_ffn_up, name)?;
                self.i_ffn_up += 1;
            }
            _ => {}
        }
        Ok(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(ftype: Ftype) -> TypeRules {
        TypeRules {
            ftype,
            pure: false,
            output_tensor_type: None,
            token_embedding_type: None,
            tensor_types: vec![],
            leave_output_tensor: false,
            has_imatrix: false,
        }
    }

    fn facts(n_layer: usize, n_gqa: usize) -> ModelFacts {
        ModelFacts {
            arch: "qwen2".into(),
            n_layer,
            n_gqa,
            n_expert: 0,
            is_70b: false,
        }
    }

    #[test]
    fn categories_follow_the_name_table() {
        assert_eq!(Category::of("blk.3.attn_v.weight"), Category::AttnV);
        assert_eq!(Category::of("blk.3.ffn_down.weight"), Category::FfnDown);
        assert_eq!(Category::of("blk.3.attn_q.bias"), Category::Other);
        assert_eq!(Category::of("output.weight"), Category::Output);
    }

    /// Q4_K_M on 8 layers: use_more_bits picks layers 0, 3, 6 and 7 (first eighth, last
    /// eighth, every third from n/8) for Q6_K attn_v and ffn_down, as hand-computed.
    #[test]
    fn q4_k_m_gives_more_bits_to_the_layers_llama_picks() {
        let r = rules(Ftype::MostlyQ4KM);
        let names: Vec<String> = (0..8)
            .flat_map(|l| {
                [
                    format!("blk.{l}.attn_v.weight"),
                    format!("blk.{l}.ffn_down.weight"),
                ]
            })
            .collect();
        let mut p = Planner::new(&r, facts(8, 2), names.iter().map(|s| s.as_str()));
        let mut got = vec![];
        for n in &names {
            got.push(p.plan(n, &[256, 256], GgmlType::F16).unwrap());
        }
        let q6: Vec<bool> = got.iter().map(|&t| t == GgmlType::Q6K).collect();
        let want: Vec<bool> = (0..8)
            .flat_map(|l| [matches!(l, 0 | 3 | 6 | 7); 2])
            .collect();
        assert_eq!(q6, want);
    }

    #[test]
    fn tied_embeddings_get_the_output_type_and_rows_that_do_not_fit_fall_back() {
        let r = rules(Ftype::MostlyQ4_0);
        let mut p = Planner::new(&r, facts(1, 1), ["token_embd.weight"]);
        assert_eq!(
            p.plan("token_embd.weight", &[256, 10], GgmlType::F16)
                .unwrap(),
            GgmlType::Q6K
        );
        let r = rules(Ftype::MostlyQ4KM);
        let mut p = Planner::new(&r, facts(1, 1), ["blk.0.attn_q.weight"]);
        assert_eq!(
            p.plan("blk.0.attn_q.weight", &[96, 10], GgmlType::F16)
                .unwrap(),
            GgmlType::Q5_0
        );
        assert_eq!(
            p.plan("blk.0.attn_q.weight", &[48, 10], GgmlType::F16)
                .unwrap(),
            GgmlType::F16
        );
        assert_eq!(p.fallbacks.len(), 2);
        assert_eq!(
            p.plan("blk.0.attn_norm.weight", &[48], GgmlType::F32)
                .unwrap(),
            GgmlType::F32
        );
    }
}
