//! Aligning the tokens in the KV with a conversation's rendering, by text.
//!
//! The chat keeps one invariant loosely: the text of the KV's tokens is a rendering of the
//! conversation. Moving to a new rendering (a new message, a closed reply, dropped turns)
//! is a text diff mapped onto token boundaries:
//! - [`keep_prefix`]: the tokens whose text is a prefix of the target (the rest of the
//!   target is then tokenized and prefilled);
//! - [`removal_window`]: a token range whose removal leaves a prefix of the target (dropping
//!   old turns by shifting the KV instead of re-prefilling).

/// The concatenated text of some tokens and where each token's text ends.
#[derive(Debug, Default, Clone)]
pub struct TokenText {
    pub bytes: Vec<u8>,
    /// `ends[i]`: byte end of token `i`.
    pub ends: Vec<usize>,
}

impl TokenText {
    pub fn from_pieces<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> TokenText {
        let mut t = TokenText::default();
        for p in pieces {
            t.bytes.extend_from_slice(p);
            t.ends.push(t.bytes.len());
        }
        t
    }

    /// Byte start of token `i` (`i == len` gives the end of the text).
    pub fn start(&self, i: usize) -> usize {
        if i == 0 {
            0
        } else {
            self.ends[i - 1]
        }
    }
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// How many leading tokens to keep: their text is a prefix of `target` and ends on a
/// character boundary of it (so the rest of `target` is valid text to tokenize).
pub fn keep_prefix(t: &TokenText, target: &str) -> usize {
    let p = common_prefix(&t.bytes, target.as_bytes());
    let mut keep = t.ends.partition_point(|&e| e <= p);
    while keep > 0 && !target.is_char_boundary(t.start(keep)) {
        keep -= 1;
    }
    keep
}

/// A token window `[i, j)` of `d` bytes whose removal leaves a prefix of `target`, if one
/// exists: bytes `[a, a + d)` with `a` and `a + d` on token boundaries, the text before `a`
/// shared with `target` and the text after `a + d` continuing `target` from `a`. The latest
/// such start is taken (the longest prefix keeps the exact KV it had).
///
/// `d` is what the dropped messages' text measures in the full rendering; the tokens may
/// hold only a prefix of that rendering (a reply not yet closed was cut back first).
pub fn removal_window(t: &TokenText, target: &[u8], d: usize) -> Option<(usize, usize)> {
    let old = &t.bytes;
    if d == 0 || d > old.len() {
        return None;
    }
    let p = common_prefix(old, target);
    // Tokens that end at or before p; their starts (and the next token's) are <= p.
    let hi = t.ends.partition_point(|&e| e <= p);
    (0..=hi).rev().find_map(|i| {
        let a = t.start(i);
        let end = a + d;
        if a > p || end > old.len() {
            return None;
        }
        let j = t.ends.partition_point(|&e| e <= end);
        if t.start(j) != end {
            return None;
        }
        let rest = &old[end..];
        (target.len() >= a + rest.len() && &target[a..a + rest.len()] == rest).then_some((i, j))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tt(pieces: &[&str]) -> TokenText {
        TokenText::from_pieces(pieces.iter().map(|p| p.as_bytes()))
    }

    #[test]
    fn keep_prefix_stops_at_the_first_token_that_differs() {
        let t = tt(&["<s>", "ab", "cd", "ef"]);
        assert_eq!(keep_prefix(&t, "<s>abcdef and more"), 4);
        assert_eq!(keep_prefix(&t, "<s>abcX"), 2);
        assert_eq!(keep_prefix(&t, "x"), 0);
        // A token that ends inside a character of the target is not kept.
        let t = TokenText::from_pieces([&b"a"[..], &[0xC3], &[0xA9]]);
        assert_eq!(keep_prefix(&t, "aé!"), 3);
        assert_eq!(keep_prefix(&t, "aê"), 1);
    }

    /// Control: a window off by one token (removing "U1" but not its closing) leaves
    /// a different text, which the assertion on the rebuilt text would catch.
    #[test]
    fn removal_window_finds_the_dropped_turn_on_token_boundaries() {
        let t = tt(&["S", "|", "u", "U1", "|", "a", "A1", "|", "u", "U2", "|"]);
        let target = b"S|uU2|";
        let d = t.bytes.len() - target.len();
        let (i, j) = removal_window(&t, target, d).unwrap();
        let mut rebuilt = t.bytes[..t.start(i)].to_vec();
        rebuilt.extend_from_slice(&t.bytes[t.start(j)..]);
        assert_eq!(rebuilt, target);
        // Tokens holding only a prefix of the rendering (a reply cut back): the window
        // leaves a prefix of the target.
        let cut = tt(&["S", "|", "u", "U1", "|", "a", "A1", "|", "u", "U"]);
        let (i, j) = removal_window(&cut, target, d).unwrap();
        let mut rebuilt = cut.bytes[..cut.start(i)].to_vec();
        rebuilt.extend_from_slice(&cut.bytes[cut.start(j)..]);
        assert!(target.starts_with(&rebuilt), "{rebuilt:?}");
        // Text that needs a substitution, not a removal, has no window.
        assert_eq!(removal_window(&t, b"S|uX|", t.bytes.len() - 5), None);
        // A cut inside a token has no window.
        let t = tt(&["S", "abc", "d"]);
        assert_eq!(removal_window(&t, b"Scd", 2), None);
    }
}
