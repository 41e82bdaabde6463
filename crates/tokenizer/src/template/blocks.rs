//! Which block tag is still open at a point of a template, so that a syntax error such as
//! "unexpected end of input" can name the `{% for %}` or `{% if %}` that was never closed.

/// Tags that open a block closed by `end<name>`.
const BLOCKS: [&str; 10] = [
    "for",
    "if",
    "macro",
    "call",
    "filter",
    "with",
    "block",
    "autoescape",
    "raw",
    "generation",
];

/// The innermost block open before byte `upto`: its keyword, 1-based line and tag text.
pub fn innermost_open(source: &str, upto: usize) -> Option<(String, usize, String)> {
    let upto = upto.min(source.len());
    let mut stack: Vec<(String, usize, String)> = Vec::new();
    let mut pos = 0;
    while let Some(rel) = source[pos..upto].find("{%") {
        let start = pos + rel;
        let Some(len) = source[start..].find("%}") else {
            break;
        };
        let end = start + len + 2;
        if end > upto {
            break;
        }
        let tag = &source[start..end];
        let inner =
            tag[2..tag.len() - 2].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        let word = inner.split_whitespace().next().unwrap_or("");
        let line = source[..start].matches('\n').count() + 1;
        // `{% set x %}...{% endset %}` is a block; `{% set x = 1 %}` is not.
        let is_block_set = word == "set" && !inner.contains('=');
        if BLOCKS.contains(&word) || is_block_set {
            stack.push((word.to_string(), line, tag.to_string()));
        } else if let Some(closed) = word.strip_prefix("end") {
            if stack.last().is_some_and(|(w, _, _)| w == closed) {
                stack.pop();
            }
        }
        pos = end;
        if word == "raw" {
            // Nothing inside `raw` is a tag.
            match source[pos..upto].find("endraw") {
                Some(r) => pos += r,
                None => break,
            }
        }
    }
    stack.pop()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_unclosed_block() {
        let src = "{% for m in messages %}\n{% if m %}x{% endif %}\n{%- if y -%}\n{% set a = 1 %}";
        let (w, line, text) = innermost_open(src, src.len()).unwrap();
        assert_eq!((w.as_str(), line, text.as_str()), ("if", 3, "{%- if y -%}"));
        assert_eq!(innermost_open(src, 23).unwrap().0, "for");
        assert!(innermost_open("{% if a %}{% endif %}", 21).is_none());
    }
}
