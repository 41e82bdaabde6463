//! Streaming detokenization: token pieces are bytes, and a UTF-8 character can be split
//! across tokens; the stream decoder holds back an incomplete character until it completes.

/// Turns a stream of token pieces into text without ever emitting part of a character.
///
/// Bytes that can never become valid UTF-8 (a stray continuation byte, `0xFF`, a truncated
/// sequence followed by something else) are emitted as U+FFFD, one per invalid sequence, like
/// `String::from_utf8_lossy`. [`StreamDecoder::finish`] flushes what is held back.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds the bytes of one token and returns the text that is now complete (maybe empty).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    // The first valid_up_to bytes are valid UTF-8 by definition.
                    out.push_str(std::str::from_utf8(&rest[..good]).unwrap_or_default());
                    match e.error_len() {
                        // An invalid sequence: replace it and go on.
                        Some(len) => {
                            out.push('\u{FFFD}');
                            rest = &rest[good + len..];
                        }
                        // An incomplete character at the end: hold it back.
                        None => {
                            rest = &rest[good..];
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        out
    }

    /// Bytes held back (an incomplete character).
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Flushes what is held back: an incomplete character at the very end becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_split_characters() {
        let mut d = StreamDecoder::new();
        let s = "a€😀b".as_bytes();
        let mut out = String::new();
        for b in s {
            let piece = d.push(std::slice::from_ref(b));
            // never part of a character: every emitted chunk is a whole-char string
            out.push_str(&piece);
        }
        out.push_str(&d.finish());
        assert_eq!(out, "a€😀b");
        let mut d = StreamDecoder::new();
        assert_eq!(d.push(&[0xE2, 0x82]), "");
        assert_eq!(d.pending(), &[0xE2, 0x82]);
        assert_eq!(d.push(&[0xAC, b'x']), "€x");
    }

    #[test]
    fn invalid_bytes_become_replacement_and_finish_flushes() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push(&[b'a', 0xFF, b'b']), "a\u{FFFD}b");
        assert_eq!(d.push(&[0xF0, 0x9F]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
        assert_eq!(d.finish(), "");
        // a truncated sequence followed by ASCII is invalid, not pending
        assert_eq!(d.push(&[0xE2, b'z']), "\u{FFFD}z");
    }
}
