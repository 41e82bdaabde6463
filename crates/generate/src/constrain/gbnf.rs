//! GBNF (llama.cpp's grammar format, `grammars/README.md`) read and written out as
//! llguidance's Lark dialect.
//!
//! The reader follows llama.cpp's grammar parser: `name ::= alternatives`, a newline ends a
//! rule except inside parentheses, `#` comments, string literals and character classes with
//! the escapes `\x.. \u.... \U........ \t \r \n \\ \" \[ \] \-`, `.`, groups, `* + ?`,
//! `{m}` `{m,}` `{m,n}` `{,n}`, and token references `<...>`. Rules become Lark rules
//! (lower-case names, so never terminals), literals Lark strings, classes single-character
//! regexes written with `\x{..}` escapes, so no GBNF character is special in the output.
//!
//! llguidance lexes greedily (a literal that can continue does), which can reject a few
//! strings a character-level GBNF engine accepts; everything it accepts is in the GBNF
//! language, so constrained replies stay valid. ADR 0007 records the trade.

use std::collections::HashMap;
use std::fmt::Write as _;

/// A GBNF text that cannot be read, with the place (1-based line and column).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("GBNF line {line}, column {col}: {msg}")]
pub struct GbnfError {
    pub line: usize,
    pub col: usize,
    pub msg: String,
}

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Literal(Vec<char>),
    /// `(negated, ranges)`, inclusive ranges.
    Class(bool, Vec<(char, char)>),
    Any,
    Rule(String),
    /// A `<...>` token reference, passed through.
    Token(String),
    Group(Vec<Vec<Node>>),
    Repeat(Box<Node>, usize, Option<usize>),
}

struct Reader<'a> {
    src: &'a [char],
    pos: usize,
}

/// Most repetitions `{m,n}` may ask for (a guard against grammars that blow up).
const MAX_REPEAT: usize = 1024;

impl<'a> Reader<'a> {
    fn err<T>(&self, msg: impl Into<String>) -> Result<T, GbnfError> {
        let before = &self.src[..self.pos.min(self.src.len())];
        let line = before.iter().filter(|&&c| c == '\n').count() + 1;
        let col = before.iter().rev().take_while(|&&c| c != '\n').count() + 1;
        Err(GbnfError {
            line,
            col,
            msg: msg.into(),
        })
    }

    fn peek(&self) -> Option<char> {
        self.src.get(self.pos).copied()
    }

    fn at(&self, s: &str) -> bool {
        s.chars()
            .enumerate()
            .all(|(i, c)| self.src.get(self.pos + i) == Some(&c))
    }

    /// Spaces, tabs and comments; newlines too when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            if c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r')) {
                self.pos += 1;
            } else if c == '#' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.pos += 1;
                }
            } else {
                break;
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            self.pos += 1;
        }
        (self.pos > start).then(|| self.src[start..self.pos].iter().collect())
    }

    fn hex(&mut self, n: usize) -> Result<char, GbnfError> {
        let mut v = 0u32;
        for _ in 0..n {
            let Some(d) = self.peek().and_then(|c| c.to_digit(16)) else {
                return self.err(format!("expected {n} hex digits in an escape"));
            };
            v = v * 16 + d;
            self.pos += 1;
        }
        char::from_u32(v).map_or_else(
            || self.err(format!("escape U+{v:X} is not a character")),
            Ok,
        )
    }

    /// One character of a literal or class, escapes read.
    fn char(&mut self) -> Result<char, GbnfError> {
        let Some(c) = self.peek() else {
            return self.err("unexpected end of grammar");
        };
        self.pos += 1;
        if c != '\\' {
            return Ok(c);
        }
        let Some(e) = self.peek() else {
            return self.err("unexpected end of grammar after '\\'");
        };
        self.pos += 1;
        match e {
            'x' => self.hex(2),
            'u' => self.hex(4),
            'U' => self.hex(8),
            't' => Ok('\t'),
            'r' => Ok('\r'),
            'n' => Ok('\n'),
            '\\' | '"' | '[' | ']' | '-' | '^' | '/' => Ok(e),
            other => self.err(format!("unknown escape \\{other}")),
        }
    }

    fn int(&mut self) -> Option<usize> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let s: String = self.src[start..self.pos].iter().collect();
        s.parse().ok()
    }

    fn alternates(&mut self, nested: bool) -> Result<Vec<Vec<Node>>, GbnfError> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Node>, GbnfError> {
        let mut seq: Vec<Node> = Vec::new();
        while let Some(c) = self.peek() {
            match c {
                '"' => {
                    self.pos += 1;
                    let mut lit = Vec::new();
                    while self.peek() != Some('"') {
                        if self.peek().is_none() {
                            return self.err("unterminated string literal");
                        }
                        lit.push(self.char()?);
                    }
                    self.pos += 1;
                    seq.push(Node::Literal(lit));
                }
                '[' => {
                    self.pos += 1;
                    let negated = self.peek() == Some('^');
                    if negated {
                        self.pos += 1;
                    }
                    let mut ranges = Vec::new();
                    while self.peek() != Some(']') {
                        if self.peek().is_none() {
                            return self.err("unterminated character class");
                        }
                        let lo = self.char()?;
                        let mut hi = lo;
                        if self.peek() == Some('-') && self.src.get(self.pos + 1) != Some(&']') {
                            self.pos += 1;
                            if self.peek().is_none() {
                                return self.err("unterminated character class");
                            }
                            hi = self.char()?;
                        }
                        if hi < lo {
                            return self.err(format!("character range {lo:?}-{hi:?} is reversed"));
                        }
                        ranges.push((lo, hi));
                    }
                    self.pos += 1;
                    if ranges.is_empty() {
                        return self.err("empty character class []");
                    }
                    seq.push(Node::Class(negated, ranges));
                }
                '.' => {
                    self.pos += 1;
                    seq.push(Node::Any);
                }
                '(' => {
                    self.pos += 1;
                    self.space(true);
                    let alts = self.alternates(true)?;
                    if self.peek() != Some(')') {
                        return self.err("expected ')'");
                    }
                    self.pos += 1;
                    seq.push(Node::Group(alts));
                }
                '<' => {
                    let start = self.pos;
                    while self.peek().is_some_and(|c| c != '>' && c != '\n') {
                        self.pos += 1;
                    }
                    if self.peek() != Some('>') {
                        return self.err("unterminated token reference <...>");
                    }
                    self.pos += 1;
                    seq.push(Node::Token(self.src[start..self.pos].iter().collect()));
                }
                '*' | '+' | '?' | '{' => {
                    let Some(last) = seq.pop() else {
                        return self.err(format!("'{c}' has nothing to repeat"));
                    };
                    self.pos += 1;
                    let (min, max) = match c {
                        '*' => (0, None),
                        '+' => (1, None),
                        '?' => (0, Some(1)),
                        _ => {
                            self.space(false);
                            let min = self.int();
                            self.space(false);
                            let max = if self.peek() == Some(',') {
                                self.pos += 1;
                                self.space(false);
                                self.int()
                            } else {
                                match min {
                                    Some(m) => Some(m),
                                    None => return self.err("expected a number in {m,n}"),
                                }
                            };
                            self.space(false);
                            if self.peek() != Some('}') {
                                return self.err("expected '}' after a repetition count");
                            }
                            self.pos += 1;
                            let min = min.unwrap_or(0);
                            if max.is_some_and(|n| n < min) {
                                return self.err(format!(
                                    "repetition {{{min},{}}} has max < min",
                                    max.unwrap_or(0)
                                ));
                            }
                            if max.unwrap_or(min) > MAX_REPEAT {
                                return self.err(format!(
                                    "repetition counts above {MAX_REPEAT} are refused"
                                ));
                            }
                            (min, max)
                        }
                    };
                    seq.push(Node::Repeat(Box::new(last), min, max));
                }
                _ => {
                    let start = self.pos;
                    match self.name() {
                        // A name followed by `::=` starts the next rule.
                        Some(n) => {
                            let save = self.pos;
                            self.space(false);
                            if self.at("::=") {
                                self.pos = start;
                                break;
                            }
                            self.pos = save;
                            seq.push(Node::Rule(n));
                        }
                        None => break,
                    }
                }
            }
            self.space(nested);
        }
        Ok(seq)
    }
}

/// Reads GBNF and writes it as llguidance Lark, `start` being GBNF's `root`.
pub fn gbnf_to_lark(src: &str) -> Result<String, GbnfError> {
    let chars: Vec<char> = src.chars().collect();
    let mut r = Reader {
        src: &chars,
        pos: 0,
    };
    let mut rules: Vec<(String, Vec<Vec<Node>>)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    r.space(true);
    while r.peek().is_some() {
        let Some(name) = r.name() else {
            return r.err("expected a rule name");
        };
        r.space(false);
        if !r.at("::=") {
            return r.err(format!("expected '::=' after rule name {name:?}"));
        }
        r.pos += 3;
        r.space(true);
        let alts = r.alternates(false)?;
        match r.peek() {
            None | Some('\n') | Some('\r') => {}
            Some(_) if r.name().is_some() => {
                // The next rule starts on the same line: llama.cpp refuses that too.
                return r.err("expected a newline before the next rule");
            }
            Some(c) => return r.err(format!("unexpected {c:?}")),
        }
        r.space(true);
        if index.contains_key(&name) {
            return r.err(format!("rule {name:?} is defined twice"));
        }
        index.insert(name.clone(), rules.len());
        rules.push((name, alts));
    }
    if !index.contains_key("root") {
        return Err(GbnfError {
            line: 1,
            col: 1,
            msg: "the grammar has no `root` rule".into(),
        });
    }
    // Every reference must name a rule.
    fn check(n: &Node, index: &HashMap<String, usize>) -> Result<(), String> {
        match n {
            Node::Rule(name) if !index.contains_key(name) => {
                Err(format!("rule {name:?} is used but not defined"))
            }
            Node::Group(alts) => alts.iter().flatten().try_for_each(|n| check(n, index)),
            Node::Repeat(inner, ..) => check(inner, index),
            _ => Ok(()),
        }
    }
    for (_, alts) in &rules {
        for n in alts.iter().flatten() {
            check(n, &index).map_err(|msg| GbnfError {
                line: 1,
                col: 1,
                msg,
            })?;
        }
    }
    let lark_name = |name: &str| -> String {
        let i = index[name];
        let clean: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        format!("r{i}_{clean}")
    };
    let mut out = format!("start: {}\n", lark_name("root"));
    for (name, alts) in &rules {
        let _ = writeln!(out, "{}: {}", lark_name(name), write_alts(alts, &lark_name));
    }
    Ok(out)
}

fn write_alts(alts: &[Vec<Node>], name: &dyn Fn(&str) -> String) -> String {
    alts.iter()
        .map(|seq| {
            if seq.is_empty() {
                "\"\"".to_string()
            } else {
                seq.iter()
                    .map(|n| write_node(n, name))
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

fn write_node(n: &Node, name: &dyn Fn(&str) -> String) -> String {
    match n {
        Node::Literal(cs) if cs.is_empty() => "\"\"".into(),
        Node::Literal(cs) => {
            // Printable text as a Lark string; anything else as a regex escape.
            if cs.iter().all(|c| !c.is_control()) {
                let mut s = String::from("\"");
                for c in cs {
                    match c {
                        '"' => s.push_str("\\\""),
                        '\\' => s.push_str("\\\\"),
                        c => s.push(*c),
                    }
                }
                s.push('"');
                s
            } else {
                let body: String = cs.iter().map(|&c| rx_char(c)).collect();
                format!("/{body}/")
            }
        }
        Node::Class(neg, ranges) => {
            let mut s = String::from("/[");
            if *neg {
                s.push('^');
            }
            for &(lo, hi) in ranges {
                s.push_str(&rx_char(lo));
                if hi != lo {
                    s.push('-');
                    s.push_str(&rx_char(hi));
                }
            }
            s.push_str("]/");
            s
        }
        Node::Any => "/(?s:.)/".into(),
        Node::Rule(r) => name(r),
        Node::Token(t) => t.clone(),
        Node::Group(alts) => format!("({})", write_alts(alts, name)),
        Node::Repeat(inner, min, max) => {
            let inner = match **inner {
                Node::Group(_) => write_node(inner, name),
                _ => format!("({})", write_node(inner, name)),
            };
            match (min, max) {
                (0, None) => format!("{inner}*"),
                (1, None) => format!("{inner}+"),
                (0, Some(1)) => format!("{inner}?"),
                (m, None) => format!("{inner}{{{m},}}"),
                (m, Some(n)) if m == n => format!("{inner}{{{m}}}"),
                (m, Some(n)) => format!("{inner}{{{m},{n}}}"),
            }
        }
    }
}

fn rx_char(c: char) -> String {
    format!("\\x{{{:X}}}", c as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_literals_classes_and_repeats_translate() {
        let lark = gbnf_to_lark(
            "root ::= greeting (\" \" name)+ [.!]? # comment\n\
             greeting ::= \"hi\" | \"hello\"\n\
             name ::= [A-Z] [a-z]{1,8}\n",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: r0_root\n\
             r0_root: r1_greeting (\" \" r2_name)+ (/[\\x{2E}\\x{21}]/)?\n\
             r1_greeting: \"hi\" | \"hello\"\n\
             r2_name: /[\\x{41}-\\x{5A}]/ (/[\\x{61}-\\x{7A}]/){1,8}\n"
        );
    }

    #[test]
    fn multi_line_rules_continue_inside_parentheses_and_after_the_arrow() {
        let lark = gbnf_to_lark("root ::=\n  \"a\" (\n   \"b\" |\n   \"c\"\n  )\n").unwrap();
        assert_eq!(lark, "start: r0_root\nr0_root: \"a\" (\"b\" | \"c\")\n");
    }

    #[test]
    fn malformed_grammars_are_refused_with_the_place() {
        for (src, what) in [
            ("root ::= \"abc", "unterminated string"),
            ("root ::= [a-", "unterminated character class"),
            ("root ::= []", "empty character class"),
            ("main ::= \"a\"", "no `root`"),
            ("root ::= foo", "\"foo\" is used but not defined"),
            ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
            ("root ::= \"a\"{3,1}", "max < min"),
            ("root ::= \"\\q\"", "unknown escape"),
            ("root ::= * \"a\"", "nothing to repeat"),
            ("root = \"a\"", "expected '::='"),
        ] {
            let e = gbnf_to_lark(src).unwrap_err().to_string();
            assert!(e.contains(what), "{src:?}: {e}");
        }
    }
}
