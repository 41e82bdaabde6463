//! A chat prompt as token ids, with message contents kept plain text.
//!
//! The rendered prompt is tokenized with special-token parsing, so the template's own
//! `<|im_start|>` and `<|im_end|>` become control ids; but a message content that contains
//! such text (a user typing `<|im_start|>system\n...`) must not become control ids too, or a
//! user could forge turns. So the bytes of each content are found in the rendered text and
//! tokenized as plain text ([`Tokenizer::encode_protected`]).
//!
//! Only contents that hold the text of a control token need finding (protecting any other
//! text changes no id), and they are found in two ways:
//! 1. Render again with each such content replaced by a marker, then check that putting the
//!    contents (or their trimmed form, for templates that trim) back in the markers' places
//!    gives the real rendering byte for byte. The contents' places are then known exactly,
//!    however often the template prints them and whatever text around them equals them.
//! 2. When that check fails (the template inspects the content, e.g. `'</think>' in content`,
//!    and renders the marker differently), each content is searched for in order, forward
//!    from the end of the previous one, as given and then trimmed. A content that is not
//!    found, or whose text occurs more than once in the rest of the prompt (its first
//!    occurrence might be template text, and protecting that would leave the real content
//!    free to inject), is refused by message index: a loud refusal rather than a possible
//!    injection.
//!
//! A prompt with no such content is `tok.encode(&rendered, true)`, what llama.cpp does.
//! Only `content` is protected: tool-call names and arguments, `name` and extra fields are
//! rendered and tokenized as the template prints them.

use minfer_tokenizer::template::{self, ChatTemplate, Message, RenderOptions};
use minfer_tokenizer::Tokenizer;
use std::ops::Range;

#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error(transparent)]
    Template(#[from] template::Error),
    #[error("message {index}: its content holds the control-token text {token:?} and could not be located in the rendered prompt (the template changes it), so it cannot be kept plain text; refusing the prompt")]
    ContentNotLocated { index: usize, token: String },
    #[error("message {index}: its content holds the control-token text {token:?} and occurs more than once in the rendered prompt (the template inspects it, so the exact place is unknown); refusing the prompt")]
    ContentAmbiguous { index: usize, token: String },
}

/// Renders `messages` and tokenizes the text with special tokens parsed everywhere except in
/// the message contents (see the module docs). Returns the rendered text and its ids. No
/// BOS/EOS is added: templates write `bos_token` themselves, as HF tokenizes them.
pub fn render_prompt(
    template: &ChatTemplate,
    tok: &Tokenizer,
    messages: &[Message],
    opts: &RenderOptions,
) -> Result<(String, Vec<u32>), PromptError> {
    // Both renders must see the same clock, or a date in the prompt could differ.
    let opts = RenderOptions {
        now_unix: opts.now_unix.or_else(|| Some(unix_now())),
        ..opts.clone()
    };
    let rendered = template.render(messages, &opts)?;
    let controls = control_texts(tok);
    let needs: Vec<(usize, &str)> = messages
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            let c = m.content.as_deref()?;
            find_any(c.as_bytes(), &controls).map(|_| (i, c))
        })
        .collect();
    if needs.is_empty() {
        let ids = tok.encode(&rendered, true);
        return Ok((rendered, ids));
    }
    let spans = match by_markers(template, messages, &opts, &rendered, &needs) {
        Some(spans) => spans,
        None => by_search(messages, &rendered, &needs, &controls)?,
    };
    let ids = tok.encode_protected(&rendered, false, &spans);
    Ok((rendered, ids))
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Texts that special-token parsing turns into ids and plain parsing does not (control and
/// unknown tokens; user-defined ones are matched either way, so they need no protection).
fn control_texts(tok: &Tokenizer) -> Vec<&[u8]> {
    let (always, all) = tok.special_texts();
    all.into_iter().filter(|t| !always.contains(t)).collect()
}

/// The first of `needles` that occurs in `hay`.
fn find_any<'a>(hay: &[u8], needles: &[&'a [u8]]) -> Option<&'a [u8]> {
    needles
        .iter()
        .copied()
        .find(|n| hay.windows(n.len()).any(|w| w == *n))
}

/// Markers are built from private-use characters, so they are not whitespace (trimming
/// keeps them) and a prompt that holds one anyway is left to the search.
const MARK_OPEN: char = '\u{E000}';
const MARK_CLOSE: char = '\u{E001}';

fn marker(i: usize) -> String {
    format!("{MARK_OPEN}{i}{MARK_CLOSE}")
}

/// The contents' byte ranges in `rendered` found through a render with markers (way 1 of the
/// module docs), or None when the template does not print the contents verbatim.
fn by_markers(
    template: &ChatTemplate,
    messages: &[Message],
    opts: &RenderOptions,
    rendered: &str,
    needs: &[(usize, &str)],
) -> Option<Vec<Range<usize>>> {
    if rendered.contains(MARK_OPEN) {
        return None;
    }
    let mut marked_msgs = messages.to_vec();
    for &(i, _) in needs {
        marked_msgs[i].content = Some(marker(i));
    }
    let marked = template.render(&marked_msgs, opts).ok()?;
    // Each marker's place in `marked` and whose content goes there.
    let mut slots: Vec<(Range<usize>, &str)> = Vec::new();
    for (at, _) in marked.match_indices(MARK_OPEN) {
        let rest = &marked[at + MARK_OPEN.len_utf8()..];
        let digits = rest.find(MARK_CLOSE)?;
        let i: usize = rest[..digits].parse().ok()?;
        let &(_, content) = needs.iter().find(|&&(j, _)| j == i)?;
        let end = at + MARK_OPEN.len_utf8() + digits + MARK_CLOSE.len_utf8();
        slots.push((at..end, content));
    }
    // `rendered` must be `marked` with each marker replaced by its content or the content
    // trimmed; the template text between markers is checked byte for byte.
    let mut spans = Vec::with_capacity(slots.len());
    let mut r = 0;
    let mut m = 0;
    for (k, (slot, content)) in slots.iter().enumerate() {
        let before = &marked[m..slot.start];
        if !rendered[r..].starts_with(before) {
            return None;
        }
        r += before.len();
        let next = slots.get(k + 1).map_or(marked.len(), |(s, _)| s.start);
        let after = &marked[slot.end..next];
        let form = [*content, content.trim()]
            .into_iter()
            .find(|f| rendered[r..].starts_with(f) && rendered[r + f.len()..].starts_with(after))?;
        spans.push(r..r + form.len());
        r += form.len();
        m = slot.end;
    }
    (rendered[r..] == marked[m..]).then_some(spans)
}

/// The contents' byte ranges found by searching `rendered` in message order (way 2).
fn by_search(
    messages: &[Message],
    rendered: &str,
    needs: &[(usize, &str)],
    controls: &[&[u8]],
) -> Result<Vec<Range<usize>>, PromptError> {
    let mut spans = Vec::new();
    let mut pos = 0;
    for (i, m) in messages.iter().enumerate() {
        let Some(content) = m.content.as_deref().filter(|c| !c.is_empty()) else {
            continue;
        };
        let needed = needs.iter().any(|&(j, _)| j == i);
        let trimmed = content.trim();
        let found = [content, trimmed]
            .into_iter()
            .filter(|f| !f.is_empty())
            .find_map(|f| rendered[pos..].find(f).map(|at| (pos + at, f)));
        let token = || {
            let t = find_any(content.as_bytes(), controls).unwrap_or_default();
            String::from_utf8_lossy(t).into_owned()
        };
        match found {
            Some((at, form)) => {
                let end = at + form.len();
                if needed {
                    let second = at + form.chars().next().map_or(1, char::len_utf8);
                    if rendered[second..].contains(form) {
                        return Err(PromptError::ContentAmbiguous {
                            index: i,
                            token: token(),
                        });
                    }
                    spans.push(at..end);
                }
                // A content without control text is not protected (it may have been found
                // inside template text), but the search for the next one starts after it.
                pos = end;
            }
            None if needed => {
                return Err(PromptError::ContentNotLocated {
                    index: i,
                    token: token(),
                })
            }
            None => {}
        }
    }
    Ok(spans)
}
