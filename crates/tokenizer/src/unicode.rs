//! Code point classes for the pre-tokenizers, and GPT-2's byte-to-character mapping.

use crate::unicode_tables::{LETTER, NUMBER, WHITESPACE};

/// The Unicode version the class tables were generated from (Python's unicodedata).
pub use crate::unicode_tables::UNICODE_VERSION;
use std::sync::OnceLock;

/// `\p{L}`.
pub const LETTER_FLAG: u8 = 1;
/// `\p{N}`.
pub const NUMBER_FLAG: u8 = 2;
/// `\s` (White_Space).
pub const WHITESPACE_FLAG: u8 = 4;

fn in_ranges(table: &[(u32, u32)], cp: u32) -> bool {
    // Ranges are sorted and disjoint: find the last range starting at or before cp.
    let i = table.partition_point(|&(lo, _)| lo <= cp);
    i > 0 && cp <= table[i - 1].1
}

fn flags_slow(cp: u32) -> u8 {
    let mut f = 0;
    if in_ranges(LETTER, cp) {
        f |= LETTER_FLAG;
    }
    if in_ranges(NUMBER, cp) {
        f |= NUMBER_FLAG;
    }
    if in_ranges(WHITESPACE, cp) {
        f |= WHITESPACE_FLAG;
    }
    f
}

/// The Basic Multilingual Plane as a direct table (64 KiB, built once); the rest of the code
/// space is rarer and binary-searched.
fn bmp_table() -> &'static [u8] {
    static TABLE: OnceLock<Vec<u8>> = OnceLock::new();
    TABLE.get_or_init(|| (0..0x10000u32).map(flags_slow).collect())
}

/// Class flags of one code point.
#[inline]
pub fn flags(c: char) -> u8 {
    let cp = c as u32;
    if cp < 0x10000 {
        bmp_table()[cp as usize]
    } else {
        flags_slow(cp)
    }
}

/// GPT-2's reversible byte-to-character map: printable Latin-1 bytes map to themselves, the
/// other 68 bytes to U+0100.. in byte order, so every byte has a visible character.
pub const fn byte_to_char_table() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        out[b] = if printable {
            match char::from_u32(b as u32) {
                Some(c) => c,
                None => '\0',
            }
        } else {
            let c = match char::from_u32(256 + n) {
                Some(c) => c,
                None => '\0',
            };
            n += 1;
            c
        };
        b += 1;
    }
    out
}

pub const BYTE_TO_CHAR: [char; 256] = byte_to_char_table();

/// The inverse of [`BYTE_TO_CHAR`]: `None` for characters no byte maps to.
#[inline]
pub fn char_to_byte(c: char) -> Option<u8> {
    static INVERSE: OnceLock<[i16; 324]> = OnceLock::new();
    let inv = INVERSE.get_or_init(|| {
        let mut t = [-1i16; 324];
        for (b, &c) in BYTE_TO_CHAR.iter().enumerate() {
            t[c as usize] = b as i16;
        }
        t
    });
    let i = c as usize;
    if i < inv.len() && inv[i] >= 0 {
        Some(inv[i] as u8)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_of_known_code_points() {
        assert_eq!(flags('a'), LETTER_FLAG);
        assert_eq!(flags('é'), LETTER_FLAG);
        assert_eq!(flags('中'), LETTER_FLAG);
        assert_eq!(flags('7'), NUMBER_FLAG);
        assert_eq!(flags('½'), NUMBER_FLAG);
        assert_eq!(flags('٣'), NUMBER_FLAG);
        assert_eq!(flags(' '), WHITESPACE_FLAG);
        assert_eq!(flags('\u{3000}'), WHITESPACE_FLAG);
        assert_eq!(flags('\u{85}'), WHITESPACE_FLAG);
        // U+180E left White_Space in Unicode 6.3; U+200B was never in it.
        assert_eq!(flags('\u{180E}'), 0);
        assert_eq!(flags('\u{200B}'), 0);
        assert_eq!(flags('!'), 0);
        assert_eq!(flags('😀'), 0);
        assert_eq!(flags('\u{20000}'), LETTER_FLAG);
        assert_eq!(flags('\u{1D7CE}'), NUMBER_FLAG);
        assert_eq!(flags('\u{301}'), 0);
    }

    #[test]
    fn tables_are_unicode_15_1_like_llama_cpp() {
        // llama.cpp's unicode-data.cpp is Unicode 15.1: CJK Extension H (15.0) and I (15.1)
        // are letters there, 16.0 additions (U+1C89) are not yet assigned.
        assert_eq!(UNICODE_VERSION, "15.1.0");
        assert_eq!(flags('\u{31350}'), LETTER_FLAG);
        assert_eq!(flags('\u{2EBF0}'), LETTER_FLAG);
        assert_eq!(flags('\u{1E4D0}'), LETTER_FLAG);
        assert_eq!(flags('\u{1C89}'), 0);
        assert_eq!(flags('\u{2EE5E}'), 0);
    }

    #[test]
    fn byte_map_is_a_bijection_with_gpt2_values() {
        assert_eq!(BYTE_TO_CHAR[b'!' as usize], '!');
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_TO_CHAR[0], 'Ā');
        assert_eq!(BYTE_TO_CHAR[0xAD], 'Ń');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(BYTE_TO_CHAR[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte('中'), None);
    }
}
