//! Tests for `metrics`: a small exposition-format checker, and the metrics checked by it.

use super::*;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

#[derive(Debug, Default)]
struct Family {
    help: Option<String>,
    kind: Option<String>,
    samples: Vec<Sample>,
}

type Exposition = BTreeMap<String, Family>;

fn is_name(text: &str) -> bool {
    let mut chars = text.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Parses `key="value",key="value"` (the text between the braces).
fn parse_labels(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut labels = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once("=\"")
            .ok_or(format!("bad label in {text:?}"))?;
        if !is_name(key) {
            return Err(format!("bad label name {key:?}"));
        }
        let end = after
            .find('"')
            .ok_or(format!("unterminated label value in {text:?}"))?;
        labels.push((key.to_string(), after[..end].to_string()));
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    Ok(labels)
}

/// Parses one sample line: `name value` or `name{labels} value`.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let (head, value) = line.rsplit_once(' ').ok_or(format!("no value: {line:?}"))?;
    let value: f64 = value.parse().map_err(|_| format!("bad value: {line:?}"))?;
    if !value.is_finite() {
        return Err(format!("non-finite value: {line:?}"));
    }
    let (name, labels) = match head.split_once('{') {
        Some((name, labels)) => {
            let labels = labels
                .strip_suffix('}')
                .ok_or(format!("unclosed labels: {line:?}"))?;
            (name, parse_labels(labels)?)
        }
        None => (head, Vec::new()),
    };
    if !is_name(name) {
        return Err(format!("bad metric name: {line:?}"));
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Which declared family a sample name belongs to (histograms own three suffixes).
fn owner<'a>(families: &'a Exposition, name: &str) -> Option<&'a str> {
    if let Some((key, _)) = families.get_key_value(name) {
        return Some(key);
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if let Some((key, family)) = families.get_key_value(base) {
                if family.kind.as_deref() == Some("histogram") {
                    return Some(key);
                }
            }
        }
    }
    None
}

fn check_histogram(name: &str, family: &Family) -> Result<(), String> {
    let mut last_le = f64::NEG_INFINITY;
    let mut last_count = 0.0;
    let mut inf_count = None;
    let (mut sum, mut count) = (None, None);
    for sample in &family.samples {
        let suffix = &sample.name[name.len()..];
        match suffix {
            "_bucket" => {
                if inf_count.is_some() {
                    return Err(format!("{name}: bucket after +Inf"));
                }
                let le = match sample.labels.as_slice() {
                    [(key, le)] if key == "le" => le,
                    _ => return Err(format!("{name}: bucket labels {:?}", sample.labels)),
                };
                let le: f64 = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().map_err(|_| format!("{name}: bad le {le:?}"))?
                };
                if le <= last_le {
                    return Err(format!("{name}: le {le} not above {last_le}"));
                }
                if sample.value < last_count || sample.value.fract() != 0.0 {
                    return Err(format!(
                        "{name}: bucket le={le} count {} not monotone after {last_count}",
                        sample.value
                    ));
                }
                last_le = le;
                last_count = sample.value;
                if le == f64::INFINITY {
                    inf_count = Some(sample.value);
                }
            }
            "_sum" if sum.is_none() => sum = Some(sample.value),
            "_count" if count.is_none() => count = Some(sample.value),
            _ => return Err(format!("{name}: unexpected sample {}", sample.name)),
        }
    }
    let inf = inf_count.ok_or(format!("{name}: no +Inf bucket"))?;
    let count = count.ok_or(format!("{name}: no _count"))?;
    let sum = sum.ok_or(format!("{name}: no _sum"))?;
    if inf != count {
        return Err(format!("{name}: +Inf bucket {inf} != _count {count}"));
    }
    if sum < 0.0 {
        return Err(format!("{name}: negative _sum {sum}"));
    }
    Ok(())
}

/// Parses and checks a whole exposition: every line well-formed, every family with HELP
/// and TYPE ahead of its samples, counters non-negative, histograms consistent.
fn check_exposition(text: &str) -> Result<Exposition, String> {
    let mut families = Exposition::new();
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            let (keyword, rest) = comment.split_once(' ').unwrap_or((comment, ""));
            let (name, arg) = rest.split_once(' ').unwrap_or((rest, ""));
            let family = match keyword {
                "HELP" | "TYPE" => families.entry(name.to_string()).or_default(),
                _ => continue,
            };
            if !family.samples.is_empty() {
                return Err(format!("{keyword} for {name} after its samples"));
            }
            let slot = if keyword == "HELP" {
                &mut family.help
            } else {
                &mut family.kind
            };
            if slot.replace(arg.to_string()).is_some() {
                return Err(format!("second {keyword} for {name}"));
            }
            continue;
        }
        let sample = parse_sample(line)?;
        let family = owner(&families, &sample.name)
            .ok_or(format!("sample {} has no declared family", sample.name))?
            .to_string();
        families.get_mut(&family).unwrap().samples.push(sample);
    }
    for (name, family) in &families {
        if !name.starts_with("minfer_") {
            return Err(format!("{name} lacks the minfer_ prefix"));
        }
        if family.help.as_deref().is_none_or(str::is_empty) {
            return Err(format!("{name} has no HELP"));
        }
        if family.samples.is_empty() {
            return Err(format!("{name} has no samples"));
        }
        match family.kind.as_deref() {
            Some("counter") if family.samples.iter().any(|s| s.value < 0.0) => {
                return Err(format!("{name}: negative counter"));
            }
            Some("counter" | "gauge") => {}
            Some("histogram") => check_histogram(name, family)?,
            other => return Err(format!("{name} has TYPE {other:?}")),
        }
    }
    Ok(families)
}

/// Checks a rendered histogram against the values actually observed: each cumulative
/// bucket must count exactly the observations at or below its bound.
fn check_against(family: &Family, observed: &[f64]) -> Result<(), String> {
    for sample in family
        .samples
        .iter()
        .filter(|s| s.name.ends_with("_bucket"))
    {
        let le = &sample.labels[0].1;
        let le: f64 = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap()
        };
        let expected = observed.iter().filter(|&&v| v <= le).count() as f64;
        if sample.value != expected {
            return Err(format!(
                "bucket le={le}: {} but {expected} observed",
                sample.value
            ));
        }
    }
    Ok(())
}

fn value(families: &Exposition, name: &str, label: Option<&str>) -> f64 {
    let family = &families[owner(families, name).unwrap_or_else(|| panic!("no {name}"))];
    let found = family
        .samples
        .iter()
        .find(|s| s.name == name && label.is_none_or(|l| s.labels.iter().any(|(_, v)| v == l)));
    found
        .unwrap_or_else(|| panic!("no sample {name} {label:?}"))
        .value
}

#[test]
fn fresh_metrics_render_every_family_at_zero() {
    let families = check_exposition(&Metrics::new().render()).unwrap();
    for name in [
        "minfer_requests_total",
        "minfer_requests_rejected_total",
        "minfer_requests_finished_total",
        "minfer_requests_running",
        "minfer_requests_queued",
        "minfer_prompt_tokens_total",
        "minfer_completion_tokens_total",
        "minfer_time_to_first_token_seconds",
        "minfer_time_per_output_token_seconds",
        "minfer_kv_cells_used",
        "minfer_kv_cells_shared",
        "minfer_kv_cells_free",
        "minfer_prefix_cache_lookups_total",
        "minfer_prefix_cache_hits_total",
        "minfer_prefix_cache_hit_tokens_total",
        "minfer_prefix_cache_prompt_tokens_total",
        "minfer_prefix_cache_hit_rate",
        "minfer_prefix_cache_entries",
        "minfer_engine_sequences",
        "minfer_kv_defrags_total",
        "minfer_forward_failures_total",
        "minfer_draining",
        "minfer_loop_forwards_total",
        "minfer_loop_rows_total",
        "minfer_loop_forward_seconds_total",
        "minfer_loop_turn_seconds_total",
        "minfer_graph_builds_total",
        "minfer_cuda_graph_captures_total",
        "minfer_cuda_graph_replays_total",
    ] {
        let family = families
            .get(name)
            .unwrap_or_else(|| panic!("missing {name}"));
        assert!(
            family.samples.iter().all(|s| s.value == 0.0),
            "{name} not zero"
        );
    }
    assert_eq!(families.len(), 29);
    // Every reason series exists before anything happened, so scrapers see stable series.
    let reasons = |name: &str| -> Vec<String> {
        families[name]
            .samples
            .iter()
            .map(|s| s.labels[0].1.clone())
            .collect()
    };
    let rejected = [
        "queue_full",
        "draining",
        "bad_request",
        "unauthorized",
        "too_large",
    ];
    assert_eq!(reasons("minfer_requests_rejected_total"), rejected);
    let finished = ["stop", "length", "tool_calls", "error", "cancelled"];
    assert_eq!(reasons("minfer_requests_finished_total"), finished);
}

#[test]
fn updates_show_up_in_render_and_readers() {
    let m = Metrics::default();
    m.request_received();
    m.request_received();
    m.request_rejected(Reject::QueueFull);
    m.request_rejected(Reject::TooLarge);
    m.request_rejected(Reject::TooLarge);
    m.request_finished(Finish::ToolCalls);
    m.set_running(3);
    m.set_queued(7);
    m.add_prompt_tokens(100);
    m.add_completion_tokens(42);
    m.set_kv(10, 4, 50);
    m.add_prefix_lookup(100, 0);
    m.add_prefix_lookup(100, 60);
    m.add_prefix_lookup(50, 90); // clamped to 50
    m.set_prefix_cache_entries(5);
    m.set_engine_sequences(7);
    m.set_defrags(3);
    m.set_defrags(2); // stale value must not move a counter backwards
    m.forward_failed();
    m.set_draining(true);

    assert_eq!(
        (m.running(), m.queued(), m.kv_used(), m.kv_free()),
        (3, 7, 10, 50)
    );
    assert_eq!(m.kv_shared(), 4);
    assert_eq!(m.requests_total(), 2);
    assert_eq!(m.rejected(Reject::TooLarge), 2);
    assert_eq!(m.finished(Finish::ToolCalls), 1);
    assert!(m.draining());

    let f = check_exposition(&m.render()).unwrap();
    assert_eq!(value(&f, "minfer_requests_total", None), 2.0);
    assert_eq!(
        value(&f, "minfer_requests_rejected_total", Some("queue_full")),
        1.0
    );
    assert_eq!(
        value(&f, "minfer_requests_rejected_total", Some("too_large")),
        2.0
    );
    assert_eq!(
        value(&f, "minfer_requests_rejected_total", Some("draining")),
        0.0
    );
    assert_eq!(
        value(&f, "minfer_requests_finished_total", Some("tool_calls")),
        1.0
    );
    assert_eq!(
        value(&f, "minfer_requests_finished_total", Some("stop")),
        0.0
    );
    assert_eq!(value(&f, "minfer_requests_running", None), 3.0);
    assert_eq!(value(&f, "minfer_requests_queued", None), 7.0);
    assert_eq!(value(&f, "minfer_prompt_tokens_total", None), 100.0);
    assert_eq!(value(&f, "minfer_completion_tokens_total", None), 42.0);
    assert_eq!(value(&f, "minfer_kv_cells_used", None), 10.0);
    assert_eq!(value(&f, "minfer_kv_cells_shared", None), 4.0);
    assert_eq!(value(&f, "minfer_kv_cells_free", None), 50.0);
    assert_eq!(value(&f, "minfer_prefix_cache_lookups_total", None), 3.0);
    assert_eq!(value(&f, "minfer_prefix_cache_hits_total", None), 2.0);
    assert_eq!(
        value(&f, "minfer_prefix_cache_hit_tokens_total", None),
        110.0
    );
    assert_eq!(
        value(&f, "minfer_prefix_cache_prompt_tokens_total", None),
        250.0
    );
    assert_eq!(
        value(&f, "minfer_prefix_cache_hit_rate", None),
        110.0 / 250.0
    );
    assert_eq!(value(&f, "minfer_prefix_cache_entries", None), 5.0);
    assert_eq!(value(&f, "minfer_engine_sequences", None), 7.0);
    assert_eq!(value(&f, "minfer_kv_defrags_total", None), 3.0);
    assert_eq!(value(&f, "minfer_forward_failures_total", None), 1.0);
    assert_eq!(value(&f, "minfer_draining", None), 1.0);
    m.set_draining(false);
    assert_eq!(
        value(
            &check_exposition(&m.render()).unwrap(),
            "minfer_draining",
            None
        ),
        0.0
    );
}

#[test]
fn histograms_bucket_observations_inclusively() {
    let m = Metrics::new();
    // Bounds themselves, values between bounds, beyond the last bound, and junk.
    let ttft = [0.005, 0.0051, 0.0, 1.0, 59.9, 60.0, 61.0, 1e6, 0.3];
    for v in ttft {
        m.observe_ttft(v);
    }
    m.observe_ttft(f64::NAN);
    m.observe_ttft(f64::INFINITY);
    m.observe_ttft(-0.002); // counted as 0
    let tpot = [0.0005, 0.001, 0.02, 2.0, 2.5];
    for v in tpot {
        m.observe_tpot(v);
    }
    let f = check_exposition(&m.render()).unwrap();
    let mut ttft_seen = ttft.to_vec();
    ttft_seen.push(0.0);
    check_against(&f["minfer_time_to_first_token_seconds"], &ttft_seen).unwrap();
    check_against(&f["minfer_time_per_output_token_seconds"], &tpot).unwrap();
    let name = "minfer_time_to_first_token_seconds";
    assert_eq!(value(&f, &format!("{name}_count"), None), 10.0);
    let sum: f64 = ttft.iter().sum();
    assert!((value(&f, &format!("{name}_sum"), None) - sum).abs() < 1e-6 * sum);
    let buckets = f[name]
        .samples
        .iter()
        .filter(|s| s.name.ends_with("_bucket"));
    assert_eq!(buckets.count(), TTFT_BUCKETS.len() + 1);
    let first = &f[name].samples[0];
    assert_eq!(first.labels, [("le".to_string(), "0.005".to_string())]);
}

#[test]
fn checker_catches_broken_buckets() {
    // Control: the checks above mean something only if a broken histogram fails them.
    let m = Metrics::new();
    let observed = [0.003, 0.2, 0.2, 7.0];
    for v in observed {
        m.observe_ttft(v);
    }
    let good = m.render();
    let f = check_exposition(&good).unwrap();
    check_against(&f["minfer_time_to_first_token_seconds"], &observed).unwrap();

    // An observation that went into the wrong slot (as an off-by-one in `slot_for` would
    // do) keeps the cumulative series monotone, so only the comparison with what was
    // observed can catch it.
    let broken = Metrics::new();
    for v in observed {
        let slot = broken.ttft.slot_for(v);
        let wrong = if v == 0.2 { slot + 1 } else { slot };
        broken.ttft.slots[wrong].fetch_add(1, Relaxed);
    }
    let f = check_exposition(&broken.render()).unwrap();
    let err = check_against(&f["minfer_time_to_first_token_seconds"], &observed).unwrap_err();
    assert!(err.contains("le=0.25"), "{err}");

    // A rendering that breaks cumulativeness, or whose +Inf disagrees with _count.
    let inflated = good.replacen(
        "minfer_time_to_first_token_seconds_bucket{le=\"0.005\"} 1",
        "minfer_time_to_first_token_seconds_bucket{le=\"0.005\"} 3",
        1,
    );
    assert_ne!(inflated, good);
    let err = check_exposition(&inflated).unwrap_err();
    assert!(err.contains("not monotone"), "{err}");
    let short_inf = good.replacen(
        "minfer_time_to_first_token_seconds_bucket{le=\"+Inf\"} 4",
        "minfer_time_to_first_token_seconds_bucket{le=\"+Inf\"} 5",
        1,
    );
    assert_ne!(short_inf, good);
    let err = check_exposition(&short_inf).unwrap_err();
    assert!(err.contains("!= _count"), "{err}");
}

#[test]
fn checker_rejects_malformed_text() {
    let good = Metrics::new().render();
    assert!(check_exposition(&good).is_ok());
    let cases = [
        good.replacen("minfer_requests_total 0", "minfer_requests_total", 1),
        good.replacen("minfer_requests_total 0", "minfer_requests_total NaN", 1),
        good.replacen("minfer_requests_total 0", "minfer_requests_total abc", 1),
        good.replacen("# HELP minfer_requests_total Requests received.\n", "", 1),
        good.replacen("# TYPE minfer_requests_total counter\n", "", 1),
        good.replacen("{reason=\"stop\"}", "{reason=\"stop\"", 1),
        format!("{good}stray_metric 1\n"),
    ];
    for (i, text) in cases.iter().enumerate() {
        assert_ne!(text, &good, "case {i} did not change the text");
        assert!(check_exposition(text).is_err(), "case {i} passed");
    }
}

#[test]
fn concurrent_updates_sum_exactly() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 10_000;
    let m = Arc::new(Metrics::new());
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                for i in 0..ROUNDS {
                    m.request_received();
                    m.request_rejected(Reject::ALL[i % 5]);
                    m.request_finished(Finish::ALL[(i + t) % 5]);
                    m.add_prompt_tokens(3);
                    m.add_completion_tokens(2);
                    // Quarters add exactly in f64, so the CAS-updated sum can be compared exactly.
                    m.observe_ttft(0.25);
                    m.observe_tpot(if i % 2 == 0 { 0.5 } else { 0.001 });
                    m.add_prefix_lookup(10, (i % 2) * 5);
                    m.forward_failed();
                    m.set_defrags(i);
                    if i % 1000 == 0 {
                        check_exposition(&m.render()).unwrap();
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let n = (THREADS * ROUNDS) as f64;
    let f = check_exposition(&m.render()).unwrap();
    assert_eq!(value(&f, "minfer_requests_total", None), n);
    for reason in Reject::ALL {
        let got = value(&f, "minfer_requests_rejected_total", Some(reason.label()));
        assert_eq!(got, n / 5.0, "{reason:?}");
    }
    for finish in Finish::ALL {
        let got = value(&f, "minfer_requests_finished_total", Some(finish.label()));
        assert_eq!(got, n / 5.0, "{finish:?}");
    }
    assert_eq!(value(&f, "minfer_prompt_tokens_total", None), 3.0 * n);
    assert_eq!(value(&f, "minfer_completion_tokens_total", None), 2.0 * n);
    let ttft = "minfer_time_to_first_token_seconds";
    assert_eq!(value(&f, &format!("{ttft}_count"), None), n);
    assert_eq!(value(&f, &format!("{ttft}_sum"), None), 0.25 * n);
    let tpot = "minfer_time_per_output_token_seconds";
    assert_eq!(value(&f, &format!("{tpot}_count"), None), n);
    assert_eq!(value(&f, &format!("{tpot}_bucket"), Some("0.001")), n / 2.0);
    assert_eq!(value(&f, &format!("{tpot}_bucket"), Some("0.5")), n);
    assert_eq!(value(&f, "minfer_prefix_cache_lookups_total", None), n);
    assert_eq!(value(&f, "minfer_prefix_cache_hits_total", None), n / 2.0);
    assert_eq!(
        value(&f, "minfer_prefix_cache_hit_tokens_total", None),
        2.5 * n
    );
    assert_eq!(
        value(&f, "minfer_prefix_cache_prompt_tokens_total", None),
        10.0 * n
    );
    assert_eq!(value(&f, "minfer_prefix_cache_hit_rate", None), 0.25);
    assert_eq!(value(&f, "minfer_forward_failures_total", None), n);
    assert_eq!(
        value(&f, "minfer_kv_defrags_total", None),
        (ROUNDS - 1) as f64
    );
}

#[test]
fn content_type_names_format_version() {
    assert!(CONTENT_TYPE.starts_with("text/plain"));
    assert!(CONTENT_TYPE.contains("version=0.0.4"));
}
