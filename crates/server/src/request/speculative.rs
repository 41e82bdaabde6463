//! minfer's `speculative` request field (issue 31): prompt lookup decoding per request.
//!
//! - absent or `null` (how OpenAI's clients send an unset optional): the server's default,
//!   `serve --lookup[=N]`, which applies to every request lookup supports (greedy or
//!   sampled, constrained or not); a request it does not support (mirostat sampling)
//!   decodes plainly, as without it.
//! - `false`: no speculation, whatever the server's default.
//! - `true` or `{"lookup": N, "draft_max": M}` (both optional: N 3, M 8): lookup for this
//!   request. A setting it cannot honour (mirostat at temperature > 0) is a 400 naming it,
//!   not a plain reply in disguise.
//!
//! Greedy replies with lookup are the plain ones token for token; sampled ones are verified
//! by speculative sampling's rule, so they are distributed as plain sampling's but a seed
//! does not give the plain reply's draws (ADR 0013). A grammar constrains the drafts and the
//! verification alike.
//!
//! Unlike OpenAI's own objects, whose unknown keys pass (newer clients send newer fields),
//! this object is minfer's: an unknown key inside it (a typo, or a drafter not built yet
//! such as `draft`) is refused by name rather than ignored.

use super::fields::kind;
use crate::error::ApiError;
use minfer_generate::lookup::LookupConfig;
use minfer_generate::sampler::{Mirostat, SamplerConfig};
use serde_json::Value;

/// What a request asked of speculation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Speculative {
    /// Nothing said: the server's default where it is exact.
    #[default]
    ServerDefault,
    /// `false`.
    Off,
    /// Asked for by the request: refused if it cannot be honoured.
    Lookup(LookupConfig),
}

/// The n-grams a request may ask for (`serve --lookup`'s range).
pub const NGRAM: std::ops::RangeInclusive<i64> = 1..=16;
/// The draft lengths a request may ask for (`serve --draft-max`'s range).
pub const DRAFT_MAX: std::ops::RangeInclusive<i64> = 1..=64;

const KEYS: [&str; 2] = ["lookup", "draft_max"];

/// Reads `speculative` from the body's value (None: absent or null).
pub fn read(v: Option<&Value>) -> Result<Speculative, ApiError> {
    let d = LookupConfig::default();
    let o = match v {
        None | Some(Value::Null) => return Ok(Speculative::ServerDefault),
        Some(Value::Bool(false)) => return Ok(Speculative::Off),
        Some(Value::Bool(true)) => return Ok(Speculative::Lookup(d)),
        Some(Value::Object(o)) => o,
        Some(v) => {
            return Err(ApiError::bad_field(
                "speculative",
                format!(
                "`speculative` must be an object such as {{\"lookup\": 3}}, or a boolean, got {}",
                kind(v)
            ),
            ))
        }
    };
    if let Some(k) = o.keys().find(|k| !KEYS.contains(&k.as_str())) {
        let name = format!("speculative.{k}");
        return Err(ApiError::bad_field(
            &name,
            format!(
                "`{name}` is not supported; `speculative` takes `lookup` (the n-gram of prompt lookup decoding) and `draft_max`"
            ),
        ));
    }
    let int =
        |key: &str, range: std::ops::RangeInclusive<i64>| -> Result<Option<usize>, ApiError> {
            let name = format!("speculative.{key}");
            let v = match o.get(key) {
                None | Some(Value::Null) => return Ok(None),
                Some(v) => v,
            };
            // Integers only: `3.0` is a client's float of 3, `3.5` a mistake.
            let x = v
                .as_i64()
                .or_else(|| {
                    v.as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 1e15)
                        .map(|f| f as i64)
                })
                .ok_or_else(|| {
                    ApiError::bad_field(
                        &name,
                        format!("`{name}` must be an integer, got {}", kind(v)),
                    )
                })?;
            if !range.contains(&x) {
                return Err(ApiError::bad_field(
                    &name,
                    format!(
                        "`{name}` = {x} is out of range ({} to {})",
                        range.start(),
                        range.end()
                    ),
                ));
            }
            Ok(Some(x as usize))
        };
    Ok(Speculative::Lookup(LookupConfig {
        ngram: int("lookup", NGRAM)?.unwrap_or(d.ngram),
        draft_max: int("draft_max", DRAFT_MAX)?.unwrap_or(d.draft_max),
    }))
}

/// Whether lookup supports a request's sampling: everything but mirostat at a temperature
/// above 0 (its running surprise bound moves with each draw and is not carried through
/// verification). A grammar, a schema or a forced tool call composes with it. An explicit
/// request that fails it is a 400 naming the field; the server's default then decodes
/// plainly.
pub fn check(sampler: &SamplerConfig) -> Result<(), ApiError> {
    if sampler.temperature > 0.0 && sampler.mirostat != Mirostat::Off {
        return Err(ApiError::bad_field(
            "speculative",
            format!(
                "`speculative` (prompt lookup) cannot be combined with `mirostat` at `temperature` {} (not supported: mirostat's surprise bound is not carried through draft verification)",
                sampler.temperature
            ),
        ));
    }
    Ok(())
}

/// The lookup a request runs with, given the server's default.
pub fn resolve(
    asked: Speculative,
    server: Option<LookupConfig>,
    sampler: &SamplerConfig,
) -> Result<Option<LookupConfig>, ApiError> {
    match asked {
        Speculative::Off => Ok(None),
        Speculative::Lookup(c) => check(sampler).map(|()| Some(c)),
        Speculative::ServerDefault => Ok(server.filter(|_| check(sampler).is_ok())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(r: Result<Speculative, ApiError>) -> String {
        format!("{:?}", r.unwrap_err())
    }

    #[test]
    fn the_shapes_read() {
        let d = LookupConfig::default();
        assert_eq!(read(None).unwrap(), Speculative::ServerDefault);
        assert_eq!(
            read(Some(&json!(null))).unwrap(),
            Speculative::ServerDefault
        );
        assert_eq!(read(Some(&json!(false))).unwrap(), Speculative::Off);
        assert_eq!(read(Some(&json!(true))).unwrap(), Speculative::Lookup(d));
        assert_eq!(read(Some(&json!({}))).unwrap(), Speculative::Lookup(d));
        assert_eq!(
            read(Some(&json!({"lookup": 2, "draft_max": 16.0}))).unwrap(),
            Speculative::Lookup(LookupConfig {
                ngram: 2,
                draft_max: 16
            })
        );
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        for (v, name) in [
            (json!({"lookup": 0}), "speculative.lookup"),
            (json!({"lookup": 17}), "speculative.lookup"),
            (json!({"lookup": 2.5}), "speculative.lookup"),
            (json!({"lookup": "3"}), "speculative.lookup"),
            (json!({"draft_max": 0}), "speculative.draft_max"),
            (json!({"draft_max": 65}), "speculative.draft_max"),
            (json!({"draft": "small.gguf"}), "speculative.draft"),
            (json!(3), "speculative"),
        ] {
            let e = msg(read(Some(&v)));
            assert!(e.contains(name), "{v}: {e}");
        }
        // Control: the edges of the ranges pass.
        assert!(read(Some(&json!({"lookup": 16, "draft_max": 64}))).is_ok());
        assert!(read(Some(&json!({"lookup": 1, "draft_max": 1}))).is_ok());
    }

    #[test]
    fn the_server_default_applies_where_supported() {
        let s = Some(LookupConfig::default());
        let on = Speculative::Lookup(LookupConfig::default());
        let sampler = |temperature, mirostat| SamplerConfig {
            temperature,
            mirostat,
            ..SamplerConfig::default()
        };
        let greedy = sampler(0.0, Mirostat::Off);
        let sampled = sampler(0.7, Mirostat::Off);
        let miro = sampler(0.7, Mirostat::V2);
        assert_eq!(resolve(Speculative::ServerDefault, s, &greedy).unwrap(), s);
        assert_eq!(resolve(Speculative::ServerDefault, s, &sampled).unwrap(), s);
        assert_eq!(resolve(Speculative::ServerDefault, s, &miro).unwrap(), None);
        // Mirostat's greedy pick is plain greedy decoding: supported.
        let miro_greedy = sampler(0.0, Mirostat::V2);
        assert_eq!(
            resolve(Speculative::ServerDefault, s, &miro_greedy).unwrap(),
            s
        );
        assert_eq!(resolve(Speculative::Off, s, &greedy).unwrap(), None);
        assert_eq!(
            resolve(Speculative::ServerDefault, None, &greedy).unwrap(),
            None
        );
        // Asked for, it is refused where the default steps aside.
        let e = format!("{:?}", resolve(on, None, &miro).unwrap_err());
        assert!(e.contains("mirostat"), "{e}");
        assert_eq!(resolve(on, None, &sampled).unwrap(), s);
        assert_eq!(resolve(on, None, &greedy).unwrap(), s);
    }
}
