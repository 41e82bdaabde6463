//! [`StringArray`]: a metadata array of strings held in one buffer.
//!
//! Tokenizer vocabularies are the bulk of a model's metadata (qwen2.5 carries 151,936 tokens
//! and 151,387 merges). One `String` per entry meant 300k allocations and as many UTF-8
//! validations at every open; one buffer plus end offsets is two allocations and one
//! validation, and costs 8 bytes per entry instead of 24 plus allocator overhead.

use std::fmt;
use std::ops::Index;

#[derive(Clone, Default, PartialEq, Eq)]
pub struct StringArray {
    /// All strings, concatenated.
    buf: String,
    /// `ends[i]` is the byte offset in `buf` where string `i` ends (it starts at `ends[i - 1]`,
    /// or 0). Every offset is a char boundary of `buf`.
    ends: Vec<usize>,
}

impl StringArray {
    pub fn new() -> Self {
        Self::default()
    }

    /// Room for `n` strings of `bytes` bytes in all.
    pub fn with_capacity(n: usize, bytes: usize) -> Self {
        Self {
            buf: String::with_capacity(bytes),
            ends: Vec::with_capacity(n),
        }
    }

    /// From a concatenation and end offsets; `None` unless the offsets are non-decreasing,
    /// end at `buf.len()`, and each is a char boundary.
    pub fn from_parts(buf: String, ends: Vec<usize>) -> Option<Self> {
        let mut prev = 0;
        for &e in &ends {
            if e < prev || !buf.is_char_boundary(e) {
                return None;
            }
            prev = e;
        }
        (prev == buf.len()).then_some(Self { buf, ends })
    }

    pub fn push(&mut self, s: &str) {
        self.buf.push_str(s);
        self.ends.push(self.buf.len());
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.buf[start..end])
    }

    pub fn iter(&self) -> Iter<'_> {
        Iter {
            arr: self,
            front: 0,
            back: self.len(),
        }
    }

    /// Owned copies, for code that wants a `Vec<String>`.
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_owned).collect()
    }

    /// All strings concatenated (no separators).
    pub fn concatenated(&self) -> &str {
        &self.buf
    }
}

impl Index<usize> for StringArray {
    type Output = str;
    /// Panics when `i` is out of bounds, like indexing a `Vec`.
    fn index(&self, i: usize) -> &str {
        match self.get(i) {
            Some(s) => s,
            None => panic!("index {i} out of bounds for {} strings", self.len()),
        }
    }
}

impl fmt::Debug for StringArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<S: AsRef<str>> FromIterator<S> for StringArray {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut a = StringArray::new();
        for s in iter {
            a.push(s.as_ref());
        }
        a
    }
}

impl From<Vec<String>> for StringArray {
    fn from(v: Vec<String>) -> Self {
        v.iter().collect()
    }
}

impl From<Vec<&str>> for StringArray {
    fn from(v: Vec<&str>) -> Self {
        v.into_iter().collect()
    }
}

impl From<&[&str]> for StringArray {
    fn from(v: &[&str]) -> Self {
        v.iter().collect()
    }
}

/// Iterator over the strings of a [`StringArray`].
#[derive(Clone, Debug)]
pub struct Iter<'a> {
    arr: &'a StringArray,
    front: usize,
    back: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a str;
    fn next(&mut self) -> Option<&'a str> {
        if self.front == self.back {
            return None;
        }
        self.front += 1;
        self.arr.get(self.front - 1)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back - self.front;
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.front == self.back {
            return None;
        }
        self.back -= 1;
        self.arr.get(self.back)
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a StringArray {
    type Item = &'a str;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_get_iter_index() {
        let a: StringArray = ["", "ab", "ü", ""].iter().collect();
        assert_eq!(a.len(), 4);
        assert_eq!(&a[1], "ab");
        assert_eq!(a.get(2), Some("ü"));
        assert_eq!(a.get(4), None);
        assert_eq!(a.iter().rev().collect::<Vec<_>>(), ["", "ü", "ab", ""]);
        assert_eq!(a.to_vec(), vec!["", "ab", "ü", ""]);
        assert_eq!(format!("{a:?}"), r#"["", "ab", "ü", ""]"#);
        assert_eq!(a.concatenated(), "abü");
    }

    #[test]
    fn from_parts_checks_offsets() {
        assert!(StringArray::from_parts("aü".into(), vec![1, 3]).is_some());
        assert!(StringArray::from_parts("aü".into(), vec![2, 3]).is_none()); // inside ü
        assert!(StringArray::from_parts("ab".into(), vec![2, 1]).is_none());
        assert!(StringArray::from_parts("ab".into(), vec![1]).is_none()); // does not reach the end
    }
}
