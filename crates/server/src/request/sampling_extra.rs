//! llama-server's sampling fields beyond the OpenAI ones: DRY, XTC, typical-p, top-n-σ,
//! mirostat and the stage order (`samplers`: an array of names or a string of letters).

use super::fields::{self, Fields};
use crate::error::ApiError;
use minfer_generate::sampler::{order, Mirostat, SamplerConfig};
use serde_json::Value;

/// Most DRY sequence breakers a request may give.
const MAX_BREAKERS: usize = 32;

/// Reads the fields into `cfg` (which holds the defaults), refusing bad values by name.
pub fn apply(f: &Fields, cfg: &mut SamplerConfig, n_ctx: usize) -> Result<(), ApiError> {
    let num = |name: &str, range| f.number(name, range).map(|v| v.map(|x| x as f32));
    if let Some(x) = num("dry_multiplier", 0.0..=f32::MAX as f64)? {
        cfg.dry_multiplier = x;
    }
    if let Some(x) = num("dry_base", 1.0..=f32::MAX as f64)? {
        cfg.dry_base = x;
    }
    if let Some(x) = f.int("dry_allowed_length", 0..=i32::MAX as i64)? {
        cfg.dry_allowed_length = x as usize;
    }
    if let Some(x) = f.int("dry_penalty_last_n", -1..=i32::MAX as i64)? {
        // −1: the whole context.
        cfg.dry_penalty_last_n = if x < 0 { n_ctx as i32 } else { x as i32 };
    }
    if f.get("dry_sequence_breakers").is_some() {
        cfg.dry_sequence_breakers = f.strings("dry_sequence_breakers", MAX_BREAKERS)?;
    }
    if let Some(x) = num("xtc_probability", 0.0..=1.0)? {
        cfg.xtc_probability = x;
    }
    if let Some(x) = num("xtc_threshold", 0.0..=1.0)? {
        cfg.xtc_threshold = x;
    }
    if let Some(x) = num("typical_p", 0.0..=1.0)? {
        cfg.typical_p = x;
    }
    if let Some(x) = num("top_n_sigma", -1.0e9..=1.0e9)? {
        cfg.top_n_sigma = x;
    }
    if let Some(x) = f.int("mirostat", 0..=2)? {
        cfg.mirostat = Mirostat::from_number(x).expect("0..=2 checked");
    }
    if let Some(x) = num("mirostat_tau", -1.0e9..=1.0e9)? {
        cfg.mirostat_tau = x;
    }
    if let Some(x) = num("mirostat_eta", -1.0e9..=1.0e9)? {
        cfg.mirostat_eta = x;
    }
    let bad = |e: order::OrderError| ApiError::bad_field("samplers", format!("`samplers`: {e}"));
    match f.get("samplers") {
        None => {}
        Some(Value::String(letters)) => {
            cfg.samplers = order::parse_letters(letters).map_err(bad)?
        }
        Some(Value::Array(names)) => {
            let names: Vec<&str> = names
                .iter()
                .map(|v| {
                    v.as_str().ok_or_else(|| {
                        ApiError::bad_field(
                            "samplers",
                            format!("`samplers` must hold names, got {}", fields::kind(v)),
                        )
                    })
                })
                .collect::<Result<_, _>>()?;
            cfg.samplers = order::parse_names(&names.join(";")).map_err(bad)?;
        }
        Some(v) => {
            return Err(ApiError::bad_field(
                "samplers",
                format!(
                    "`samplers` must be an array of names or a string of letters, got {}",
                    fields::kind(v)
                ),
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_generate::sampler::Stage;
    use serde_json::json;

    fn read(body: Value) -> Result<SamplerConfig, ApiError> {
        let mut c = SamplerConfig::default();
        apply(&Fields::of(&body)?, &mut c, 4096)?;
        Ok(c)
    }

    #[test]
    fn llama_server_fields_reach_the_config() {
        let c = read(json!({
            "dry_multiplier": 0.8, "dry_penalty_last_n": -1, "dry_sequence_breakers": ["\n"],
            "xtc_probability": 0.5, "typical_p": 0.9, "top_n_sigma": 1.0,
            "mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2,
            "samplers": ["top_k", "temperature"]
        }))
        .unwrap();
        assert_eq!(c.dry_multiplier, 0.8);
        assert_eq!(c.dry_penalty_last_n, 4096);
        assert_eq!(c.dry_sequence_breakers, vec!["\n".to_string()]);
        assert_eq!(
            (c.xtc_probability, c.typical_p, c.top_n_sigma),
            (0.5, 0.9, 1.0)
        );
        assert_eq!(c.mirostat, Mirostat::V2);
        assert_eq!(c.samplers, vec![Stage::TopK, Stage::Temperature]);
        let c = read(json!({"samplers": "kt"})).unwrap();
        assert_eq!(c.samplers, vec![Stage::TopK, Stage::Temperature]);
        assert_eq!(read(json!({})).unwrap(), SamplerConfig::default());
    }

    #[test]
    fn bad_values_name_the_field() {
        for (body, name) in [
            (json!({"mirostat": 3}), "mirostat"),
            (json!({"dry_base": 0.5}), "dry_base"),
            (json!({"samplers": ["bogus"]}), "bogus"),
            (json!({"samplers": 3}), "samplers"),
            (json!({"xtc_probability": 2}), "xtc_probability"),
        ] {
            let e = format!("{:?}", read(body).unwrap_err());
            assert!(e.contains(name), "{e}");
        }
    }
}
