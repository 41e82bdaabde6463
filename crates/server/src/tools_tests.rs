//! Tests for `tools`: the whole-reply and streaming parsers held to each other, and ids.

use super::*;
use std::collections::HashSet;

type Parsed = Result<(Option<String>, Vec<ParsedCall>), ToolParseError>;

fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall {
        name: name.to_string(),
        arguments: arguments.to_string(),
    }
}

/// Streams `pieces` and folds the deltas into the shape `parse_tool_calls` returns,
/// checking along the way that no empty content is released and the tag never leaks.
fn stream(pieces: &[&str]) -> Parsed {
    stream_with(ToolStream::new(), pieces)
}

fn stream_with(mut parser: ToolStream, pieces: &[&str]) -> Parsed {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut fold = |deltas: Vec<ToolDelta>| {
        for delta in deltas {
            match delta {
                ToolDelta::Content(text) => {
                    assert!(!text.is_empty(), "empty content delta");
                    assert!(!text.contains(OPEN), "tag leaked into content: {text:?}");
                    content.push_str(&text);
                }
                ToolDelta::Call(call) => calls.push(call),
            }
        }
    };
    for piece in pieces {
        fold(parser.push(piece)?);
    }
    fold(parser.finish()?);
    assert_eq!(parser.saw_call(), !calls.is_empty());
    Ok(((!content.is_empty()).then_some(content), calls))
}

/// Byte offsets of every char boundary strictly inside `text`.
fn inner_boundaries(text: &str) -> Vec<usize> {
    (1..text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect()
}

fn split_at_all(text: &str, cuts: &[usize]) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut from = 0;
    for &cut in cuts {
        pieces.push(text[from..cut].to_string());
        from = cut;
    }
    pieces.push(text[from..].to_string());
    pieces
}

/// A small deterministic generator for the random splits.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = splitmix64(self.0);
        (self.0 % n as u64) as usize
    }
}

/// The streaming parser must agree with the whole-reply parse however `text` is split:
/// in one piece, in two at every char boundary, char by char, and at random cuts.
fn assert_agree(text: &str) -> Parsed {
    assert_agree_with(text, None)
}

/// [`assert_agree`] with bare JSON calls to `names` read (`names` None: not read), against
/// [`parse_reply`] (or [`parse_tool_calls`]).
fn assert_agree_with(text: &str, names: Option<&[String]>) -> Parsed {
    let whole = match names {
        Some(n) => parse_reply(text, n),
        None => parse_tool_calls(text),
    };
    let parser = || match names {
        Some(n) => ToolStream::with_bare_json(n.to_vec()),
        None => ToolStream::new(),
    };
    let check = |pieces: &[&str], how: &str| {
        assert_eq!(stream_with(parser(), pieces), whole, "{how} of {text:?}");
    };
    check(&[text], "one piece");
    check(&["", text, ""], "with empty pieces");
    for cut in inner_boundaries(text) {
        check(&[&text[..cut], &text[cut..]], &format!("split at {cut}"));
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
    check(&chars, "char by char");
    let boundaries = inner_boundaries(text);
    let mut rng = Rng(text.len() as u64);
    for round in 0..50 {
        let mut cuts: Vec<usize> = (0..rng.below(8).min(boundaries.len()))
            .map(|_| boundaries[rng.below(boundaries.len())])
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        let pieces = split_at_all(text, &cuts);
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        check(&pieces, &format!("random split {round} {cuts:?}"));
    }
    whole
}

fn content_and_calls(text: &str) -> (Option<String>, Vec<ParsedCall>) {
    assert_agree(text).unwrap_or_else(|err| panic!("{text:?}: {err}"))
}

const WEATHER: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

#[test]
fn plain_text_and_empty_replies() {
    assert_eq!(
        content_and_calls("Hello, world!"),
        (Some("Hello, world!".into()), vec![])
    );
    assert_eq!(content_and_calls(""), (None, vec![]));
    assert_eq!(content_and_calls("  \n\t "), (None, vec![]));
    let (content, calls) = content_and_calls("  Two\n\nparagraphs.  \n");
    assert_eq!(content.as_deref(), Some("Two\n\nparagraphs."));
    assert!(calls.is_empty());
}

#[test]
fn single_call_in_qwen_layout() {
    let (content, calls) = content_and_calls(WEATHER);
    assert_eq!(content, None);
    assert_eq!(calls, [call("get_weather", r#"{"city":"Paris"}"#)]);
    // Whitespace around the JSON varies between models and sampling runs.
    let tight = r#"<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>"#;
    assert_eq!(content_and_calls(tight).1, calls);
    let loose = "\n<tool_call>  \r\n\t{ \"name\" : \"get_weather\" ,\n  \"arguments\" : { \"city\" : \"Paris\" } }  \n\n</tool_call>\n";
    assert_eq!(content_and_calls(loose), (None, calls));
}

#[test]
fn content_before_between_and_after_calls() {
    let text = format!(
        "Let me check.\n\n{WEATHER}\nAnd also:\n{}\nDone.\n",
        r#"<tool_call>{"name": "get_time", "arguments": {"tz": "CET"}}</tool_call>"#
    );
    let (content, calls) = content_and_calls(&text);
    assert_eq!(
        content.as_deref(),
        Some("Let me check.\n\n\nAnd also:\n\nDone.")
    );
    assert_eq!(
        calls,
        [
            call("get_weather", r#"{"city":"Paris"}"#),
            call("get_time", r#"{"tz":"CET"}"#)
        ]
    );
}

#[test]
fn several_calls_with_only_whitespace_between_have_no_content() {
    let text = format!("{WEATHER}\n{WEATHER}\n\n{WEATHER}\n");
    let (content, calls) = content_and_calls(&text);
    assert_eq!(content, None);
    assert_eq!(calls.len(), 3);
}

#[test]
fn arguments_forms() {
    let cases = [
        // Given as a string holding JSON: re-serialized compact.
        (
            r#"{"name": "f", "arguments": "{\"a\": 1,  \"b\": [true, null]}"}"#,
            r#"{"a":1,"b":[true,null]}"#,
        ),
        // Missing, null or empty string: no arguments.
        (r#"{"name": "f"}"#, "{}"),
        (r#"{"name": "f", "arguments": null}"#, "{}"),
        (r#"{"name": "f", "arguments": " "}"#, "{}"),
        (r#"{"name": "f", "arguments": {}}"#, "{}"),
        // Key order is the model's, and braces inside strings do not confuse anything.
        (
            r#"{"arguments": {"z": 1, "a": {"q": "}{"}}, "name": "f"}"#,
            r#"{"z":1,"a":{"q":"}{"}}"#,
        ),
        (
            r#"{"name": "f", "arguments": {"city": "Zürich ☃ 東京"}}"#,
            r#"{"city":"Zürich ☃ 東京"}"#,
        ),
    ];
    for (json, arguments) in cases {
        let text = format!("<tool_call>\n{json}\n</tool_call>");
        assert_eq!(
            content_and_calls(&text),
            (None, vec![call("f", arguments)]),
            "{json}"
        );
    }
}

#[test]
fn almost_tags_are_content() {
    // A tag prefix at the very end of the reply is released as content at finish.
    for text in [
        "see <tool_c",
        "see <",
        "see <tool_call",
        "x</tool_call>",
        "a < b <tool_ca c",
    ] {
        assert_eq!(
            content_and_calls(text),
            (Some(text.to_string()), vec![]),
            "{text:?}"
        );
    }
    let (content, calls) = content_and_calls(&format!("<<tool_c{WEATHER}<"));
    assert_eq!(content.as_deref(), Some("<<tool_c<"));
    assert_eq!(calls.len(), 1);
}

#[test]
fn non_ascii_content_survives_every_split() {
    let text = format!("Météo à Zürich ☃ — 東京も？\n{WEATHER}\n結果を待ちます 🌦");
    let (content, calls) = content_and_calls(&text);
    assert_eq!(
        content.as_deref(),
        Some("Météo à Zürich ☃ — 東京も？\n\n結果を待ちます 🌦")
    );
    assert_eq!(calls.len(), 1);
}

#[test]
fn unclosed_block_at_eos() {
    let complete = [
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n",
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}",
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_",
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call",
    ];
    for text in complete {
        assert_eq!(
            content_and_calls(text),
            (None, vec![call("f", r#"{"x":1}"#)]),
            "{text:?}"
        );
    }
    let text = format!("Sure.{WEATHER}{}", complete[0]);
    let (content, calls) = content_and_calls(&text);
    assert_eq!((content.as_deref(), calls.len()), (Some("Sure."), 2));

    for text in [
        "<tool_call>",
        "hi <tool_call>\n",
        "<tool_call>{\"name\": \"f\", \"argu",
    ] {
        let err = assert_agree(text).unwrap_err();
        assert!(
            matches!(err, ToolParseError::Unclosed { .. }),
            "{text:?}: {err:?}"
        );
    }
}

#[test]
fn bad_blocks_are_errors() {
    type IsExpected = fn(&ToolParseError) -> bool;
    let cases: [(&str, IsExpected); 7] = [
        ("{name: get_weather}", |e| {
            matches!(e, ToolParseError::BadJson { .. })
        }),
        (r#"{"name": "f"} trailing"#, |e| {
            matches!(e, ToolParseError::BadJson { .. })
        }),
        (r#"[1, 2]"#, |e| {
            matches!(e, ToolParseError::NotAnObject { .. })
        }),
        (r#"{"arguments": {}}"#, |e| {
            matches!(e, ToolParseError::MissingName { .. })
        }),
        (r#"{"name": 3}"#, |e| {
            matches!(e, ToolParseError::MissingName { .. })
        }),
        (r#"{"name": "f", "arguments": 3}"#, |e| {
            matches!(e, ToolParseError::BadArguments { .. })
        }),
        (
            r#"{"name": "f", "arguments": "not json"}"#,
            |e| matches!(e, ToolParseError::BadArguments { name, .. } if name == "f"),
        ),
    ];
    for (json, expected) in cases {
        for text in [
            format!("<tool_call>\n{json}\n</tool_call>"),
            format!("Text first. {WEATHER} then <tool_call>{json}</tool_call> after"),
        ] {
            let err = assert_agree(&text).unwrap_err();
            assert!(expected(&err), "{text:?}: {err:?}");
        }
    }
    let valid_array_arguments = r#"<tool_call>{"name": "f", "arguments": "[1]"}</tool_call>"#;
    assert!(matches!(
        parse_tool_calls(valid_array_arguments),
        Err(ToolParseError::BadArguments { .. })
    ));
}

#[test]
fn error_messages_say_what_and_quote_briefly() {
    let long = format!(
        "{{\"name\": \"f\", \"arguments\": {{\"text\": \"{}\"",
        "x".repeat(1000)
    );
    let err = parse_tool_calls(&format!("<tool_call>{long}</tool_call>")).unwrap_err();
    let ToolParseError::BadJson { reason, snippet } = &err else {
        panic!("{err:?}");
    };
    assert!(reason.contains("EOF"), "{reason}");
    assert_eq!(snippet.chars().count(), SNIPPET_CHARS + 1);
    assert!(snippet.ends_with('…'));
    let message = err.to_string();
    assert!(
        message.starts_with("tool call is not valid JSON"),
        "{message}"
    );
    assert!(message.chars().count() < SNIPPET_CHARS + 100, "{message}");

    let err = parse_tool_calls(r#"<tool_call>{"arguments": {}}</tool_call>"#).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"tool call has no "name" string: {"arguments": {}}"#
    );
}

#[test]
fn stream_holds_back_only_what_might_be_a_tag() {
    let mut parser = ToolStream::new();
    let content = |text: &str| vec![ToolDelta::Content(text.to_string())];
    // The space is held as possible trailing whitespace, "<tool_" as a possible tag.
    assert_eq!(parser.push("Hello <tool_").unwrap(), content("Hello"));
    assert!(!parser.saw_call());
    let deltas = parser
        .push("call>{\"name\": \"f\"}</tool_call> Bye")
        .unwrap();
    // The held space comes out now that content follows it: the reply reads "Hello  Bye".
    let bye = ToolDelta::Content("  Bye".into());
    assert_eq!(deltas, [ToolDelta::Call(call("f", "{}")), bye]);
    assert!(parser.saw_call());
    assert_eq!(parser.push("\n").unwrap(), []);
    assert_eq!(parser.finish().unwrap(), []);

    // `<tool_c` that turns out not to be a tag is released with what follows.
    let mut parser = ToolStream::new();
    assert_eq!(parser.push("x <tool_c").unwrap(), content("x"));
    assert_eq!(parser.push("ould be").unwrap(), content(" <tool_could be"));
    assert_eq!(parser.finish().unwrap(), []);
    assert!(!parser.saw_call());
}

#[test]
fn stream_releases_each_call_when_its_tag_closes() {
    let mut parser = ToolStream::new();
    assert_eq!(parser.push("<tool_call>{\"name\": \"a\"}").unwrap(), []);
    assert_eq!(parser.push("</tool_call").unwrap(), []);
    assert_eq!(
        parser.push(">").unwrap(),
        [ToolDelta::Call(call("a", "{}"))]
    );
    let second = "\n<tool_call>{\"name\": \"b\", \"arguments\": {\"k\": \"v\"}}</tool_call>";
    assert_eq!(
        parser.push(second).unwrap(),
        [ToolDelta::Call(call("b", r#"{"k":"v"}"#))]
    );
    assert_eq!(parser.finish().unwrap(), []);
}

#[test]
fn stream_keeps_deltas_from_before_an_error() {
    let mut parser = ToolStream::new();
    assert!(parser.push("Hi <tool_call>{bad}</tool_call>").is_err());
    // The bad block is dropped; "Hi" completed before it and comes with the next call.
    let deltas = parser.push(" more").unwrap();
    assert_eq!(deltas, [ToolDelta::Content("Hi  more".into())]);
    assert!(parser.push("<tool_call>{\"name\"").unwrap().is_empty());
    assert!(matches!(
        parser.finish(),
        Err(ToolParseError::Unclosed { .. })
    ));
    assert_eq!(parser.finish().unwrap(), []);
}

#[test]
fn stream_is_reusable_after_finish() {
    let mut parser = ToolStream::new();
    assert_eq!(
        parser.push("one ").unwrap(),
        [ToolDelta::Content("one".into())]
    );
    assert_eq!(parser.finish().unwrap(), []);
    assert_eq!(
        parser.push("  two").unwrap(),
        [ToolDelta::Content("two".into())]
    );
}

#[test]
fn long_block_streamed_in_small_pieces() {
    // The close-tag search resumes where it left off; the result must not depend on it.
    let value = "é".repeat(3000);
    let text = format!(
        "<tool_call>{{\"name\": \"f\", \"arguments\": {{\"v\": \"{value}\"}}}}</tool_call>"
    );
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    let (content, calls) = stream(&pieces).unwrap();
    assert_eq!(content, None);
    assert_eq!(calls, [call("f", &format!("{{\"v\":\"{value}\"}}"))]);
}

#[test]
fn call_ids_are_unique_and_well_formed() {
    let ids: Vec<String> = (0..10_000).map(|_| new_call_id()).collect();
    for id in &ids {
        let tail = id.strip_prefix("call_").unwrap_or_else(|| panic!("{id}"));
        assert_eq!(tail.len(), 24, "{id}");
        assert!(tail.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
    }
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());
    // Random-looking: consecutive ids share no long common prefix.
    assert!(ids
        .windows(2)
        .all(|w| w[0][5..9] != w[1][5..9] || w[0][9..13] != w[1][9..13]));

    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                (0..2500)
                    .map(|_| random_id("chatcmpl-"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all = HashSet::new();
    for thread in threads {
        for id in thread.join().unwrap() {
            assert!(
                id.starts_with("chatcmpl-") && id.len() == "chatcmpl-".len() + 24,
                "{id}"
            );
            assert!(all.insert(id));
        }
    }
}

#[test]
fn splitmix64_is_a_reference_match() {
    // The first outputs of the reference splitmix64 generator seeded with 0.
    let first = splitmix64(0);
    assert_eq!(first, 0xE220_A839_7B1D_CDAF);
    assert_eq!(splitmix64(GOLDEN_GAMMA), 0x6E78_9E6A_A1B9_65F4);
}

fn bare(text: &str) -> (Option<String>, Vec<ParsedCall>) {
    let names = vec!["get_weather".to_string(), "get_time".to_string()];
    assert_agree_with(text, Some(&names)).unwrap_or_else(|err| panic!("{text:?}: {err}"))
}

/// Issue 30: a call written as bare JSON, without the tags (qwen2.5-coder at temperature
/// 0), is a call when it names one of the request's tools, whole and however it is streamed.
/// Control: the same replies without the tools' names (`ToolStream::new`, `parse_tool_calls`:
/// what the server did before) are plain content.
#[test]
fn bare_json_calls_to_the_requests_tools_are_calls() {
    let weather = call("get_weather", r#"{"city":"Paris"}"#);
    let time = call("get_time", r#"{"zone":"utc"}"#);
    for text in [
        r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
        "\n  {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n",
        r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#,
        r#"{"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}"#,
        "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
        "```\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
    ] {
        assert_eq!(bare(text), (None, vec![weather.clone()]), "{text:?}");
        let plain = assert_agree(text).unwrap();
        assert_eq!(
            plain,
            (Some(text.trim().to_string()), vec![]),
            "control: {text:?}"
        );
    }
    let two = [
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc\"}}",
        r#"[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"zone": "utc"}}]"#,
    ];
    for text in two {
        assert_eq!(
            bare(text),
            (None, vec![weather.clone(), time.clone()]),
            "{text:?}"
        );
    }
    // No arguments: a function without parameters.
    assert_eq!(
        bare(r#"{"name": "get_time"}"#),
        (None, vec![call("get_time", "{}")])
    );
    // The tags still work beside it.
    assert_eq!(bare(WEATHER), (None, vec![weather]));
}

/// JSON that is not only calls to the request's tools stays content: another name, a key
/// besides name/arguments, text around it, broken JSON, one good call beside a bad one.
#[test]
fn json_that_is_not_a_bare_call_is_content() {
    for text in [
        r#"{"name": "get_stock", "arguments": {"s": "X"}}"#,
        r#"{"name": "get_weather", "arguments": {"city": "Paris"}, "id": 3}"#,
        r#"{"city": "Paris"}"#,
        r#"Here: {"name": "get_weather", "arguments": {"city": "Paris"}}"#,
        r#"{"name": "get_weather", "arguments": {"city": "Paris"}} done"#,
        r#"{"name": "get_weather", "arguments": {"city": "Par"#,
        r#"{"name": "get_weather", "arguments": [1]}"#,
        "[1, 2]",
        "[]",
        "```python\n{\"name\": \"get_weather\", \"arguments\": {}}\n```",
        "{\"name\": \"get_weather\", \"arguments\": {}}\n{\"name\": \"nope\", \"arguments\": {}}",
        "`code`",
        "``",
    ] {
        assert_eq!(
            bare(text),
            (Some(text.trim().to_string()), vec![]),
            "{text:?}"
        );
    }
}

/// A stream with bare JSON read is reusable, and a reply that is not JSON streams as it
/// comes (only a JSON-looking start is held).
#[test]
fn bare_json_stream_holds_only_json_looking_replies() {
    let mut p = ToolStream::with_bare_json(vec!["get_time".into()]);
    assert_eq!(
        p.push("Hello").unwrap(),
        vec![ToolDelta::Content("Hello".into())]
    );
    assert_eq!(p.finish().unwrap(), vec![]);
    assert!(
        p.push("{\"name\": \"get_time\"").unwrap().is_empty(),
        "held"
    );
    assert!(p.push(", \"arguments\": {}}").unwrap().is_empty(), "held");
    assert_eq!(
        p.finish().unwrap(),
        vec![ToolDelta::Call(call("get_time", "{}"))]
    );
    assert!(p.saw_call());
    assert!(p.push("{\"a\": 1}").unwrap().is_empty(), "held");
    assert_eq!(
        p.finish().unwrap(),
        vec![ToolDelta::Content("{\"a\": 1}".into())]
    );
}
