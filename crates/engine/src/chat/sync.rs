//! Aligning the tokens in the KV with a conversation's rendering, by text.
//!
//! The chat keeps one invariant loosely: the text of the KV's tokens is a rendering of the
//! conversation. Moving to a new rendering (a new message, a closed reply, dropped turns)
//! is a text diff mapped onto token boundaries:
//! - [`keep_prefix`]: the tokens whose text is a prefix of the target (the rest of the
//!   target is then tokenized and prefilled);
//! - [`removal_window`]: a token range whose removal leaves exactly the target (dropping old
//!   turns by shifting the KV instead of re-prefilling).

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

fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    a.iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
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

/// A token window `[i, j)` whose removal leaves exactly `target`, if one exists: the text
/// minus bytes `[a, a + d)` equals `target` for every `a` between `len(target) - suffix`
/// and `prefix` (the shared prefix and suffix), and the window must start and end on token
/// boundaries. The latest such start is taken.
pub fn removal_window(t: &TokenText, target: &[u8]) -> Option<(usize, usize)> {
    let old = &t.bytes;
    if target.len() >= old.len() {
        return None;
    }
    let d = old.len() - target.len();
    let p = common_prefix(old, target);
    let s = common_suffix(old, target).min(target.len());
    let lo = target.len() - s;
    if lo > p {
        return None;
    }
    let n = t.ends.len();
    // Token starts in [lo, p], latest first.
    let first = (0..=n).find(|&i| t.start(i) >= lo)?;
    (first..=n)
        .rev()
        .filter(|&i| t.start(i) <= p)
        .find_map(|i| {
            let a = t.start(i);
            let end = a + d;
            let j = (i..=n).find(|&j| t.start(j) >= end)?;
            (t.start(j) == end).then_some((i, j))
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
        let (i, j) = removal_window(&t, target).unwrap();
        let mut rebuilt = t.bytes[..t.start(i)].to_vec();
        rebuilt.extend_from_slice(&t.bytes[t.start(j)..]);
        assert_eq!(rebuilt, target);
        // Text that needs a substitution, not a removal, has no window.
        assert_eq!(removal_window(&t, b"S|uX|"), None);
        // A cut inside a token has no window.
        let t = tt(&["S", "abc", "d"]);
        assert_eq!(removal_window(&t, b"Scd"), None);
    }
}
