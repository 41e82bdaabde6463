//! The fuzzer's request generator and mutators (`serve_fuzz.rs`): valid requests of the
//! API's shapes, hostile JSON values, node mutations and byte-level breakage.

use minfer_testkit::rng::Rng;
use serde_json::{json, Map, Value};

pub fn pick<'a, T>(rng: &mut Rng, xs: &'a [T]) -> &'a T {
    &xs[rng.below(xs.len())]
}

pub fn chance(rng: &mut Rng, percent: usize) -> bool {
    rng.below(100) < percent
}

pub fn text(rng: &mut Rng) -> String {
    let words = [
        "hi",
        "hello",
        "a",
        "the",
        "json",
        "<|im_start|>",
        "é",
        "日本",
        "\n",
        "{",
    ];
    (0..1 + rng.below(6))
        .map(|_| *pick(rng, &words))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A valid request of one of the API's shapes: (method, path, body).
pub fn generate(rng: &mut Rng) -> (&'static str, &'static str, Option<Value>) {
    match rng.below(10) {
        0 => {
            let paths = ["/health", "/v1/models", "/metrics", "/"];
            ("GET", *pick(rng, &paths), None)
        }
        1 => ("POST", "/tokenize", Some(json!({"content": text(rng)}))),
        2 => (
            "POST",
            "/detokenize",
            Some(json!({"tokens": (0..rng.below(8)).map(|_| rng.below(300)).collect::<Vec<_>>()})),
        ),
        3 | 4 => {
            let mut b = Map::new();
            let prompt = match rng.below(3) {
                0 => json!(text(rng)),
                1 => json!([text(rng), text(rng)]),
                _ => json!((0..1 + rng.below(6))
                    .map(|_| rng.below(290))
                    .collect::<Vec<_>>()),
            };
            b.insert("prompt".into(), prompt);
            sampling(rng, &mut b);
            if chance(rng, 20) {
                b.insert("logprobs".into(), json!(rng.below(4)));
            }
            if chance(rng, 10) {
                b.insert("echo".into(), json!(true));
            }
            ("POST", "/v1/completions", Some(Value::Object(b)))
        }
        _ => {
            let mut b = Map::new();
            let roles = ["system", "user", "assistant", "user"];
            let messages: Vec<Value> = (0..1 + rng.below(3))
                .map(|i| json!({"role": roles[(i + 1) % 4], "content": text(rng)}))
                .collect();
            b.insert("messages".into(), json!(messages));
            sampling(rng, &mut b);
            if chance(rng, 20) {
                b.insert(
                    "tools".into(),
                    json!([{"type": "function", "function": {"name": "get_weather",
                        "description": "the weather", "parameters": {"type": "object",
                        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]),
                );
                let choice = [json!("auto"), json!("none"), json!("required")];
                b.insert("tool_choice".into(), pick(rng, &choice).clone());
            }
            if chance(rng, 10) {
                let formats = [
                    json!({"type": "json_object"}),
                    json!({"type": "json_schema", "json_schema": {"name": "x", "schema":
                        {"type": "object", "properties": {"a": {"type": "integer"}}}}}),
                ];
                b.insert("response_format".into(), pick(rng, &formats).clone());
            }
            if chance(rng, 15) {
                b.insert("logprobs".into(), json!(true));
                b.insert("top_logprobs".into(), json!(rng.below(5)));
            }
            ("POST", "/v1/chat/completions", Some(Value::Object(b)))
        }
    }
}

pub fn sampling(rng: &mut Rng, b: &mut Map<String, Value>) {
    b.insert("max_tokens".into(), json!(1 + rng.below(6)));
    let fields: [(&str, Value); 9] = [
        ("temperature", json!(rng.below(20) as f64 / 10.0)),
        ("top_p", json!(rng.below(10) as f64 / 10.0)),
        ("top_k", json!(rng.below(50))),
        ("seed", json!(rng.below(1000))),
        ("n", json!(1 + rng.below(2))),
        ("stream", json!(chance(rng, 40))),
        ("stop", json!(["\n", "the"])),
        ("presence_penalty", json!(0.5)),
        ("stream_options", json!({"include_usage": true})),
    ];
    for (k, v) in fields {
        if chance(rng, 40) {
            b.insert(k.into(), v);
        }
    }
}

/// A value of a random other kind, or a hostile one of the same.
pub fn hostile_value(rng: &mut Rng) -> Value {
    match rng.below(14) {
        0 => Value::Null,
        1 => json!(true),
        2 => json!(-1),
        3 => json!(u64::MAX),
        4 => json!(i64::MIN),
        5 => json!(1e308),
        6 => json!(-0.0),
        7 => json!("x".repeat(1 + rng.below(70_000))),
        8 => json!([]),
        9 => json!({}),
        10 => json!([1, "a", null, {"b": []}]),
        11 => {
            // Deeper than any parser should recurse into.
            let mut v = json!(1);
            for _ in 0..(10 + rng.below(300)) {
                v = json!([v]);
            }
            v
        }
        12 => json!(2_147_483_648u64),
        _ => json!("<tool_call>{\"name\": \"get_weather\"}</tool_call>"),
    }
}

/// Mutates one random node of `v` (or its keys).
pub fn mutate_json(rng: &mut Rng, v: &mut Value, depth: usize) {
    let descend = depth < 6 && chance(rng, 60);
    match v {
        Value::Object(m) if !m.is_empty() => {
            let keys: Vec<String> = m.keys().cloned().collect();
            let k = pick(rng, &keys).clone();
            match rng.below(6) {
                0 => {
                    m.remove(&k);
                }
                1 => {
                    let unknown = ["nonsense", "", "max_tokens ", "\u{0}", "n\u{301}"];
                    m.insert(pick(rng, &unknown).to_string(), hostile_value(rng));
                }
                _ if descend => mutate_json(rng, m.get_mut(&k).unwrap(), depth + 1),
                _ => {
                    m.insert(k, hostile_value(rng));
                }
            }
        }
        Value::Array(a) if !a.is_empty() => {
            let i = rng.below(a.len());
            if descend {
                mutate_json(rng, &mut a[i], depth + 1);
            } else if chance(rng, 30) {
                let x = a[i].clone();
                a.extend(std::iter::repeat_n(x, 1 + rng.below(200)));
            } else {
                a[i] = hostile_value(rng);
            }
        }
        _ => *v = hostile_value(rng),
    }
}

/// Serializes `v`, then maybe breaks the bytes: raw numbers JSON cannot hold, lone
/// surrogates, duplicate keys, invalid UTF-8, truncation, flipped bytes.
pub fn to_bytes(rng: &mut Rng, v: &Value) -> Vec<u8> {
    let mut b = serde_json::to_vec(v).unwrap();
    if !chance(rng, 40) {
        return b;
    }
    let at = |rng: &mut Rng, b: &Vec<u8>| rng.below(b.len().max(1));
    match rng.below(8) {
        0 => {
            let s = String::from_utf8_lossy(&b).replacen("1", "1e400", 1);
            b = s.into_bytes();
        }
        1 => {
            let s = String::from_utf8_lossy(&b).replacen("\"hi", "\"\\ud800hi", 1);
            b = s.into_bytes();
        }
        2 => {
            // A duplicate key: `{"max_tokens":1,"max_tokens":"x",…`
            if b.first() == Some(&b'{') {
                b.splice(1..1, br#""max_tokens":1,"max_tokens":"x","#.iter().copied());
            }
        }
        3 => {
            let i = at(rng, &b);
            b.splice(i..i, [0xff, 0xfe, 0xc3].iter().copied());
        }
        4 => {
            let i = at(rng, &b);
            b.truncate(i);
        }
        5 => {
            for _ in 0..1 + rng.below(4) {
                let i = at(rng, &b);
                if let Some(x) = b.get_mut(i) {
                    *x ^= 1 << rng.below(8);
                }
            }
        }
        6 => b = b"[]".to_vec(),
        _ => b.extend_from_slice(b" trailing"),
    }
    b
}
