//! minfer's `speculative` request field (issue 31): prompt lookup decoding per request, and
//! leaving the server's draft model.
//!
//! - absent or `null` (how OpenAI's clients send an unset optional): the server's default
//!   drafter, `serve --lookup[=N]`, `--draft MODEL` or `--self-draft LAYERS`, which applies
//!   to every request it supports (greedy or sampled, constrained or not); a request it
//!   does not support (mirostat sampling) decodes plainly, as without it.
//! - `false`: no speculation, whatever the server's default.
//! - `{"draft": false}`: not the server's draft model (a server whose default is lookup
//!   keeps it).
//! - `{"draft": true, "draft_max": M}` (`draft_max` optional): the server's draft model
//!   (`serve --draft` or `--self-draft`; the model is the server's to choose) with at most M
//!   tokens drafted a forward for this request (default the server's `--draft-max`); a 400
//!   naming `speculative.draft` on a server without one, naming `speculative.draft_max` below
//!   the server's `--draft-min` (it would never draft), and naming `speculative.lookup` with
//!   `lookup` beside it (two drafters). `draft` takes no value but a boolean.
//! - `true` or `{"lookup": N, "draft_max": M}` (both optional: N 3, M 8): lookup for this
//!   request, also on a server that drafts with a model (the request's own choice wins over
//!   the server's default). A setting it cannot honour (mirostat at temperature > 0) is a
//!   400 naming it, not a plain reply in disguise.
//!
//! Greedy replies with lookup are the plain ones token for token; sampled ones are verified
//! by speculative sampling's rule, so they are distributed as plain sampling's but a seed
//! does not give the plain reply's draws (ADR 0013). A grammar constrains the drafts and the
//! verification alike.
//!
//! Unlike OpenAI's own objects, whose unknown keys pass (newer clients send newer fields),
//! this object is minfer's: an unknown key inside it (a typo) is refused by name rather than
//! ignored.

use super::fields::kind;
use crate::error::ApiError;
use minfer_generate::draft::DraftHandle;
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
    /// `{"draft": false}`: the server's default unless it is a draft model.
    NoDraftModel,
    /// Asked for by the request: refused if it cannot be honoured.
    Lookup(LookupConfig),
    /// `{"draft": true}`: the server's draft model, with this request's most drafted tokens
    /// a forward if it gave `draft_max`; refused if it cannot be honoured.
    DraftModel(Option<usize>),
}

/// The n-grams a request may ask for (`serve --lookup`'s range).
pub const NGRAM: std::ops::RangeInclusive<i64> = 1..=16;
/// The draft lengths a request may ask for (`serve --draft-max`'s range).
pub const DRAFT_MAX: std::ops::RangeInclusive<i64> = 1..=64;

const KEYS: [&str; 3] = ["lookup", "draft_max", "draft"];

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
                "`{name}` is not supported; `speculative` takes `lookup` (the n-gram of prompt lookup decoding), `draft_max` and `draft` (false: not the server's draft model)"
            ),
        ));
    }
    match o.get("draft") {
        None | Some(Value::Null) | Some(Value::Bool(_)) => {}
        Some(v) => {
            return Err(ApiError::bad_field(
                "speculative.draft",
                format!(
                    "`speculative.draft` takes `true` (the server's draft model) or `false` (not it); the model is chosen by `serve --draft` or `--self-draft`, got {}",
                    kind(v)
                ),
            ))
        }
    }
    let unset = |k: &str| matches!(o.get(k), None | Some(Value::Null));
    if o.get("draft") == Some(&Value::Bool(false)) && unset("lookup") && unset("draft_max") {
        return Ok(Speculative::NoDraftModel);
    }
    let model = o.get("draft") == Some(&Value::Bool(true));
    if model && !unset("lookup") {
        return Err(ApiError::bad_field(
            "speculative.lookup",
            "`speculative.lookup` asks for prompt lookup and `speculative.draft` = true for the server's draft model: one drafter a request".to_string(),
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
    if model {
        return Ok(Speculative::DraftModel(int("draft_max", DRAFT_MAX)?));
    }
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

/// The server's default drafter (`serve --lookup`, `--draft`, `--self-draft`: one at most).
#[derive(Clone, Debug, Default)]
pub enum ServerDrafter {
    #[default]
    None,
    Lookup(LookupConfig),
    /// A draft model or self-drafting.
    Model(DraftHandle),
}

/// The drafter a request runs with.
#[derive(Clone, Debug, Default)]
pub enum Drafter {
    #[default]
    None,
    Lookup(LookupConfig),
    Model(DraftHandle),
}

impl Drafter {
    pub fn lookup(&self) -> Option<LookupConfig> {
        match self {
            Drafter::Lookup(c) => Some(*c),
            _ => None,
        }
    }

    pub fn model(&self) -> Option<DraftHandle> {
        match self {
            Drafter::Model(h) => Some(h.clone()),
            _ => None,
        }
    }
}

/// The drafter a request runs with, given the server's default.
pub fn resolve(
    asked: Speculative,
    server: &ServerDrafter,
    sampler: &SamplerConfig,
) -> Result<Drafter, ApiError> {
    let default = || match server {
        _ if check(sampler).is_err() => Drafter::None,
        ServerDrafter::None => Drafter::None,
        ServerDrafter::Lookup(c) => Drafter::Lookup(*c),
        ServerDrafter::Model(h) => Drafter::Model(h.clone()),
    };
    match asked {
        Speculative::Off => Ok(Drafter::None),
        Speculative::Lookup(c) => check(sampler).map(|()| Drafter::Lookup(c)),
        Speculative::DraftModel(max) => {
            let ServerDrafter::Model(h) = server else {
                return Err(ApiError::bad_field(
                    "speculative.draft",
                    "`speculative.draft` = true asks for the server's draft model, and this server has none (start it with `serve --draft MODEL` or `--self-draft LAYERS`)".to_string(),
                ));
            };
            check(sampler)?;
            let mut h = h.clone();
            if let Some(m) = max {
                if m < h.cfg.draft_min {
                    return Err(ApiError::bad_field(
                        "speculative.draft_max",
                        format!(
                            "`speculative.draft_max` = {m} is below the server's `--draft-min` {}: the draft model would never propose",
                            h.cfg.draft_min
                        ),
                    ));
                }
                // The request's own length; the engine and its other requests keep theirs.
                h.cfg.draft_max = m;
            }
            Ok(Drafter::Model(h))
        }
        Speculative::NoDraftModel => Ok(match default() {
            Drafter::Model(_) => Drafter::None,
            d => d,
        }),
        Speculative::ServerDefault => Ok(default()),
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
            (json!({"draft": 0}), "speculative.draft"),
            (json!({"draft": true, "lookup": 2}), "speculative.lookup"),
            (
                json!({"draft": true, "draft_max": 0}),
                "speculative.draft_max",
            ),
            (json!({"drafts": false}), "speculative.drafts"),
            (json!(3), "speculative"),
        ] {
            let e = msg(read(Some(&v)));
            assert!(e.contains(name), "{v}: {e}");
        }
        // Control: the booleans are the values `draft` takes.
        assert_eq!(
            read(Some(&json!({"draft": false}))).unwrap(),
            Speculative::NoDraftModel
        );
        assert_eq!(
            read(Some(&json!({"draft": true}))).unwrap(),
            Speculative::DraftModel(None)
        );
        assert_eq!(
            read(Some(&json!({"draft": true, "draft_max": 3}))).unwrap(),
            Speculative::DraftModel(Some(3))
        );
        // Control: the edges of the ranges pass.
        assert!(read(Some(&json!({"lookup": 16, "draft_max": 64}))).is_ok());
        assert!(read(Some(&json!({"lookup": 1, "draft_max": 1}))).is_ok());
    }

    /// A draft model that is never run (the resolution only passes its handle on).
    struct Idle;
    impl minfer_generate::draft::DraftModel for Idle {
        fn open(&mut self) -> Result<minfer_generate::draft::DraftSeq, String> {
            unreachable!()
        }
        fn close(&mut self, _: minfer_generate::draft::DraftSeq) {}
        fn propose(
            &mut self,
            _: &mut [minfer_generate::draft::Ask<'_>],
        ) -> Vec<Result<minfer_generate::draft::Proposal, String>> {
            unreachable!()
        }
        fn open_seqs(&self) -> usize {
            0
        }
        fn forwards(&self) -> usize {
            0
        }
    }

    fn name(d: Result<Drafter, ApiError>) -> String {
        match d.unwrap() {
            Drafter::None => "none".into(),
            Drafter::Lookup(c) => format!("lookup {}", c.ngram),
            Drafter::Model(h) => format!("model {}", h.cfg.draft_max),
        }
    }

    #[test]
    fn the_server_default_applies_where_supported() {
        let l = ServerDrafter::Lookup(LookupConfig::default());
        let m = ServerDrafter::Model(DraftHandle::new(Idle, Default::default()));
        let none = ServerDrafter::None;
        let on = Speculative::Lookup(LookupConfig {
            ngram: 2,
            draft_max: 8,
        });
        let sampler = |temperature, mirostat| SamplerConfig {
            temperature,
            mirostat,
            ..SamplerConfig::default()
        };
        let greedy = sampler(0.0, Mirostat::Off);
        let sampled = sampler(0.7, Mirostat::Off);
        let miro = sampler(0.7, Mirostat::V2);
        let dflt = Speculative::ServerDefault;
        for (server, want) in [(&l, "lookup 3"), (&m, "model 8")] {
            assert_eq!(name(resolve(dflt, server, &greedy)), want);
            assert_eq!(name(resolve(dflt, server, &sampled)), want);
            assert_eq!(name(resolve(dflt, server, &miro)), "none");
            // Mirostat's greedy pick is plain greedy decoding: supported.
            let miro_greedy = sampler(0.0, Mirostat::V2);
            assert_eq!(name(resolve(dflt, server, &miro_greedy)), want);
            assert_eq!(name(resolve(Speculative::Off, server, &greedy)), "none");
            // A request's own lookup wins over either default.
            assert_eq!(name(resolve(on, server, &greedy)), "lookup 2");
        }
        // `{"draft": false}` leaves a draft model, not a lookup default.
        let no_model = Speculative::NoDraftModel;
        assert_eq!(name(resolve(no_model, &m, &greedy)), "none");
        assert_eq!(name(resolve(no_model, &l, &greedy)), "lookup 3");
        assert_eq!(name(resolve(dflt, &none, &greedy)), "none");
        // Asked for, it is refused where the default steps aside.
        let e = format!("{:?}", resolve(on, &none, &miro).unwrap_err());
        assert!(e.contains("mirostat"), "{e}");
        assert_eq!(name(resolve(on, &none, &sampled)), "lookup 2");

        // `{"draft": true}`: the server's model, at the request's length if it gave one;
        // the server's handle keeps its own.
        let ask = |max| Speculative::DraftModel(max);
        assert_eq!(name(resolve(ask(None), &m, &greedy)), "model 8");
        assert_eq!(name(resolve(ask(Some(3)), &m, &sampled)), "model 3");
        let ServerDrafter::Model(h) = &m else {
            unreachable!()
        };
        assert_eq!(h.cfg.draft_max, 8, "the server's own length is untouched");
        // Refused: no model on the server (a lookup default is not one), mirostat sampling,
        // a length under the server's --draft-min.
        for server in [&none, &l] {
            let e = format!("{:?}", resolve(ask(None), server, &greedy).unwrap_err());
            assert!(
                e.contains("speculative.draft") && e.contains("has none"),
                "{e}"
            );
        }
        let e = format!("{:?}", resolve(ask(None), &m, &miro).unwrap_err());
        assert!(e.contains("mirostat"), "{e}");
        let min4 = ServerDrafter::Model(DraftHandle::new(
            Idle,
            minfer_generate::draft::DraftConfig {
                draft_min: 4,
                ..Default::default()
            },
        ));
        let e = format!("{:?}", resolve(ask(Some(3)), &min4, &greedy).unwrap_err());
        assert!(
            e.contains("speculative.draft_max") && e.contains("--draft-min"),
            "{e}"
        );
        assert_eq!(name(resolve(ask(Some(4)), &min4, &greedy)), "model 4");
    }
}
