//! The chat-template renderer under random Jinja (issue 34): the templates of the corpus
//! (`fixtures/chat`: Qwen, SmolLM, the HF-compat cases) cut into tags and text, then
//! mutated — pieces deleted, duplicated, swapped, borrowed from another template, hostile
//! fragments inserted (deep recursion, nested loops, huge repetitions, unknown filters,
//! undefined names), characters replaced by random Unicode, the source cut short — and
//! compiled and rendered with random conversations. Each mutant must compile or be refused
//! with a typed error, and render or be refused, without a panic, within a time bound
//! (a template comes from a model file, which is untrusted input), with output of bounded
//! size.
//!
//! `MINFER_TEMPLATE_FUZZ_CASES` sets the number (default 1000, ~6 s);
//! `MINFER_FUZZ_SEED` replays a run.
//!
//! Found and fixed with it: no bound on a render's work (fuel now, `RENDER_FUEL`) nor on
//! its output (`RENDER_OUTPUT_LIMIT`: three `'x' * 10⁸` gave 300 MB). Controls: without
//! `set_fuel` in template/mod.rs's `environment`, case 375 (nested loops) runs 7 s, to
//! the output limit, and the time bound fails (the silent nested loop would run for
//! hours); without the output limit, case 2061 of a 3000 run renders 300 MB and fails.
//! And a panic inside minijinja (`''[::-1]`), now a render error:
//! `a_panic_inside_the_template_engine_is_a_render_error`. And a list grown by `+` in a
//! long loop (43 s, fuel does not see the cost), now ended by the render's deadline:
//! `a_list_grown_in_a_long_loop_ends_at_the_render_deadline`.

use minfer_testkit::rng::Rng;
use minfer_tokenizer::template::{
    ChatTemplate, Message, RenderOptions, SpecialTokens, RENDER_DEADLINE,
};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

fn cases() -> u64 {
    std::env::var("MINFER_TEMPLATE_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000)
}

fn corpus() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let text = std::fs::read_to_string(&p).unwrap();
        match p.extension().and_then(|x| x.to_str()) {
            Some("jinja") => out.push(text),
            Some("jsonl") => {
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    let j: serde_json::Value = serde_json::from_str(line).unwrap();
                    if let Some(t) = j["template"].as_str() {
                        out.push(t.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    out.sort();
    out.dedup();
    // Qwen2.5, SmolLM2 and the HF-compat cases: few, but each a different style.
    assert!(out.len() >= 4, "the corpus: {} templates", out.len());
    out
}

/// Tags (`{% … %}`, `{{ … }}`, `{# … #}`) and the text between them.
fn pieces(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find('{') {
        let close = match rest[i..].chars().nth(1) {
            Some('%') => "%}",
            Some('{') => "}}",
            Some('#') => "#}",
            _ => {
                out.push(rest[..i + 1].to_string());
                rest = &rest[i + 1..];
                continue;
            }
        };
        if i > 0 {
            out.push(rest[..i].to_string());
        }
        match rest[i..].find(close) {
            Some(j) => {
                out.push(rest[i..i + j + 2].to_string());
                rest = &rest[i + j + 2..];
            }
            None => {
                out.push(rest[i..].to_string());
                rest = "";
            }
        }
    }
    if !rest.is_empty() {
        out.push(rest.to_string());
    }
    out
}

const HOSTILE: &[&str] = &[
    "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}",
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ 'x' * 100000000 }}",
    "{{ ('ab' * 50000000) | length }}",
    "{{ messages | tojson }}",
    "{{ undefined_name.attr.deeper }}",
    "{{ messages[10**18] }}",
    "{{ 1 / 0 }}",
    "{{ messages | nosuchfilter }}",
    // Not here: a list grown by `+` in a 10⁵ loop (QUADRATIC below), which fuel does not
    // bound and the render deadline ends after 1 s (a second per mutant that holds it);
    // see `a_list_grown_in_a_long_loop_ends_at_the_render_deadline`.
    "{{ raise_exception('no') }}",
    "{{ strftime_now('%Y-%m-%d %Q') }}",
    "{% for m in messages %}{{ m.content[::-1] }}{{ m['tool_calls'][0].function.arguments | tojson }}{% endfor %}",
    "{%",
    "{{",
    "{% endfor %}",
    "{% if %}",
    "{{ (((((((((((((((((((((((((((((((1))))))))))))))))))))))))))))))) }}",
    "{{ [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]] }}",
    "{{ messages[0]['content'].split('').__class__ }}",
];

fn random_char(rng: &mut Rng) -> char {
    loop {
        let c = match rng.below(4) {
            0 => rng.below(0x80) as u32,
            1 => rng.below(0x800) as u32,
            2 => 0x1F600 + rng.below(0x50) as u32,
            _ => rng.below(0x11_0000) as u32,
        };
        if let Some(c) = char::from_u32(c) {
            return c;
        }
    }
}

fn mutate(rng: &mut Rng, corpus: &[String]) -> String {
    let mut p = pieces(&corpus[rng.below(corpus.len())]);
    for _ in 0..1 + rng.below(4) {
        let n = p.len().max(1);
        match rng.below(7) {
            0 if !p.is_empty() => {
                p.remove(rng.below(n));
            }
            1 if !p.is_empty() => {
                let x = p[rng.below(n)].clone();
                p.insert(rng.below(n), x);
            }
            2 if p.len() > 1 => {
                let (a, b) = (rng.below(n), rng.below(n));
                p.swap(a, b);
            }
            3 => {
                let other = pieces(&corpus[rng.below(corpus.len())]);
                if !other.is_empty() {
                    p.insert(rng.below(n), other[rng.below(other.len())].clone());
                }
            }
            4 => p.insert(rng.below(n), HOSTILE[rng.below(HOSTILE.len())].to_string()),
            5 if !p.is_empty() => {
                let i = rng.below(n);
                let mut cs: Vec<char> = p[i].chars().collect();
                if !cs.is_empty() {
                    let j = rng.below(cs.len());
                    cs[j] = random_char(rng);
                }
                p[i] = cs.into_iter().collect();
            }
            _ => {
                let s: String = p.concat();
                let cut: String = s.chars().take(rng.below(s.chars().count() + 1)).collect();
                p = vec![cut];
            }
        }
    }
    p.concat()
}

fn conversation(rng: &mut Rng) -> (Vec<Message>, RenderOptions) {
    let text = |rng: &mut Rng| -> String { (0..rng.below(30)).map(|_| random_char(rng)).collect() };
    let mut msgs = Vec::new();
    if rng.below(2) == 0 {
        msgs.push(Message::system(text(rng)));
    }
    for i in 0..1 + rng.below(4) {
        msgs.push(if i % 2 == 0 {
            Message::user(text(rng))
        } else {
            Message::assistant(text(rng))
        });
    }
    let tools = (rng.below(3) == 0).then(|| {
        serde_json::json!([{"type": "function", "function": {"name": "f", "description": text(rng),
            "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}])
    });
    let opts = RenderOptions {
        add_generation_prompt: rng.below(2) == 0,
        tools,
        now_unix: Some(0),
        ..RenderOptions::default()
    };
    (msgs, opts)
}

/// Found by this fuzzer (case 71 at the default seed, 42.8 s for one render): each `+`
/// copies the list, so 10⁵ iterations copy 5·10⁹ values, and fuel counts instructions, not
/// their cost. Now the render's deadline (`RENDER_DEADLINE`, checked as `range` yields) ends
/// it with an error naming the deadline. Control: without the `range` of
/// template/deadline.rs (minijinja's own again) the render runs its 43 s and this fails.
const QUADRATIC: &str = "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = ns.x + [i] %}{% endfor %}{{ ns.x | length }}";

#[test]
fn a_list_grown_in_a_long_loop_ends_at_the_render_deadline() {
    let tpl = ChatTemplate::compile_with(QUADRATIC, SpecialTokens::default(), true, true).unwrap();
    let t = Instant::now();
    let r = tpl.render(&[Message::user("hi")], &RenderOptions::default());
    let took = t.elapsed();
    eprintln!("the quadratic render ended after {took:?}: {r:?}");
    let e = r.expect_err("the render cannot finish within its deadline");
    assert!(
        e.to_string().contains("ran past its deadline of 1 s"),
        "{e}"
    );
    // The deadline, plus the 64 items at most between two clock reads.
    assert!(
        took < RENDER_DEADLINE + Duration::from_millis(500),
        "{took:?}"
    );
    // The same loop, short, still renders (the deadline is per render, not per template),
    // and the range keeps its size for `length`.
    let short = QUADRATIC.replace("100000", "1000");
    let tpl = ChatTemplate::compile_with(&short, SpecialTokens::default(), true, true).unwrap();
    let ok = tpl.render(&[Message::user("hi")], &RenderOptions::default());
    assert_eq!(ok.unwrap(), "1000");
    let len = ChatTemplate::compile_with(
        "{{ range(7) | length }}{% if range(0) %}x{% endif %}{{ range(10, 0, -3) | list }}",
        SpecialTokens::default(),
        true,
        true,
    )
    .unwrap();
    let out = len.render(&[Message::user("hi")], &RenderOptions::default());
    assert_eq!(out.unwrap(), "7[10, 7, 4, 1]");
}

/// Regression (case 6617 at the default seed, 20 000 cases): minijinja 2.24 panics on a
/// reversed slice of an empty string; the render now returns an error instead. Control:
/// without the `catch_unwind` in `ChatTemplate::render` this test panics.
#[test]
fn a_panic_inside_the_template_engine_is_a_render_error() {
    let tpl = ChatTemplate::compile_with(
        "{% for m in messages %}{{ m.content[::-1] }}{% endfor %}",
        SpecialTokens::default(),
        true,
        true,
    )
    .unwrap();
    let ok = tpl.render(&[Message::user("ab")], &RenderOptions::default());
    assert_eq!(ok.unwrap(), "ba");
    let e = tpl
        .render(&[Message::user("")], &RenderOptions::default())
        .unwrap_err();
    assert!(e.to_string().contains("template engine failed"), "{e}");
}

/// How long one compile + render may take: far above a real template's microseconds,
/// far below a hang.
const BOUND: Duration = Duration::from_secs(5);

#[test]
fn mutated_templates_compile_and_render_or_are_refused_without_a_panic_or_a_hang() {
    let seed = std::env::var("MINFER_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7E3B_1A7E);
    let corpus = corpus();
    let special = SpecialTokens::default();
    let mut rng = Rng::splitmix64(seed);
    let mut outcomes = std::collections::BTreeMap::<&str, u64>::new();
    let (mut worst, mut worst_src) = (Duration::ZERO, String::new());
    let t0 = Instant::now();
    let n = cases();
    for i in 0..n {
        let src = mutate(&mut rng, &corpus);
        let (msgs, opts) = conversation(&mut rng);
        let t = Instant::now();
        let r = catch_unwind(AssertUnwindSafe(|| {
            let tpl = ChatTemplate::compile_with(&src, special.clone(), true, true)?;
            tpl.render(&msgs, &opts)
        }));
        let took = t.elapsed();
        if took > worst {
            (worst, worst_src) = (took, src.clone());
        }
        let kind = match r {
            Err(_) => panic!("case {i} (seed {seed}) panicked on the template {src:?}"),
            Ok(Ok(out)) => {
                assert!(
                    out.len() <= minfer_tokenizer::template::RENDER_OUTPUT_LIMIT,
                    "case {i}: {} bytes of output",
                    out.len()
                );
                "rendered"
            }
            Ok(Err(e)) => {
                assert!(!e.to_string().is_empty());
                match e {
                    minfer_tokenizer::template::Error::Parse { .. } => "parse error",
                    minfer_tokenizer::template::Error::Render { .. } => "render error",
                    minfer_tokenizer::template::Error::Raised { .. } => "raised",
                    _ => "other error",
                }
            }
        };
        assert!(
            took < BOUND,
            "case {i} (seed {seed}): {took:?} for the template {src:?}"
        );
        *outcomes.entry(kind).or_default() += 1;
    }
    eprintln!(
        "{n} templates in {:.1} s (seed {seed}): {outcomes:?}; slowest {worst:?}: {:?}",
        t0.elapsed().as_secs_f64(),
        &worst_src[..worst_src.len().min(200)]
    );
    assert!(outcomes.contains_key("rendered") && outcomes.contains_key("parse error"));
}
