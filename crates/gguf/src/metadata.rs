//! Ordered GGUF metadata with lookup by key.
//!
//! The lookup index is a list of entry numbers sorted by key (4 bytes an entry, binary
//! search), not a hash map: a file of many tiny entries then costs little more memory than
//! the entries themselves, which keeps the parser's memory bound tight (see
//! `tests/mutation.rs`), and models have few enough keys that a lookup is a handful of
//! comparisons.

use crate::string_array::StringArray;
use crate::value::{Array, Value};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    /// Indices into `entries`, sorted by key; keys are unique.
    sorted: Vec<u32>,
}

impl Metadata {
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds the index over parsed entries; `Err((key, i))` names entry `i`, whose key an
    /// earlier entry already has.
    pub(crate) fn from_entries(mut entries: Vec<(String, Value)>) -> Result<Self, (String, usize)> {
        let mut sorted: Vec<u32> = (0..entries.len() as u32).collect();
        sorted.sort_unstable_by(|&a, &b| {
            entries[a as usize]
                .0
                .cmp(&entries[b as usize].0)
                .then(a.cmp(&b))
        });
        for w in sorted.windows(2) {
            if entries[w[0] as usize].0 == entries[w[1] as usize].0 {
                let i = w[1] as usize;
                return Err((entries.swap_remove(i).0, i));
            }
        }
        Ok(Self { entries, sorted })
    }

    /// Position in `sorted` of `key`, or where it would go.
    fn find(&self, key: &str) -> Result<usize, usize> {
        self.sorted
            .binary_search_by(|&i| self.entries[i as usize].0.as_str().cmp(key))
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        let pos = self.find(key).ok()?;
        Some(&self.entries[self.sorted[pos] as usize].1)
    }
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Inserts or replaces a key, keeping first-insertion order.
    pub fn set(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.find(&key) {
            Ok(pos) => self.entries[self.sorted[pos] as usize].1 = value,
            Err(pos) => {
                self.sorted.insert(pos, self.entries.len() as u32);
                self.entries.push((key, value));
            }
        }
    }
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let pos = self.find(key).ok()?;
        let i = self.sorted.remove(pos);
        let (_, v) = self.entries.remove(i as usize);
        for idx in &mut self.sorted {
            if *idx > i {
                *idx -= 1;
            }
        }
        Some(v)
    }
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(Value::as_bool)
    }
    pub fn get_array(&self, key: &str) -> Option<&Array> {
        self.get(key).and_then(Value::as_array)
    }
    /// A string array (e.g. `tokenizer.ggml.tokens`); None if absent or of another type.
    pub fn get_strings(&self, key: &str) -> Option<&StringArray> {
        self.get_array(key).and_then(Array::as_strings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_remove_keep_order_and_index() {
        let mut m = Metadata::new();
        for (i, k) in ["b", "a", "c", "a"].iter().enumerate() {
            m.set(*k, Value::U32(i as u32));
        }
        let keys: Vec<_> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["b", "a", "c"]);
        assert_eq!(m.get_u64("a"), Some(3));
        assert_eq!(m.remove("b"), Some(Value::U32(0)));
        assert_eq!(m.get_u64("a"), Some(3));
        assert_eq!(m.get_u64("c"), Some(2));
        assert_eq!(m.get("b"), None);
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn from_entries_finds_the_later_duplicate() {
        let e = |k: &str| (k.to_string(), Value::Bool(true));
        assert_eq!(
            Metadata::from_entries(vec![e("x"), e("y"), e("x")]).unwrap_err(),
            ("x".to_string(), 2)
        );
        assert!(Metadata::from_entries(vec![e("x"), e("y")]).is_ok());
    }
}
