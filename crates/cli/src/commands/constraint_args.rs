//! Constrained-output flags shared by `run` and `chat`: `--json-schema`,
//! `--json-schema-file`, `--grammar` (GBNF), `--grammar-file`, `--regex`. At most one may
//! be given; the grammar is compiled before the prompt is read, so a refusal costs nothing.

use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use minfer_generate::constrain::{ConstraintSpec, Grammar, Grammars};
use minfer_tokenizer::Tokenizer;
use std::path::PathBuf;

#[derive(ClapArgs, Debug, Clone, Default)]
pub struct ConstraintArgs {
    /// The reply is JSON following this JSON Schema (`{}` allows any JSON value).
    #[arg(short = 'j', long = "json-schema", value_name = "JSON")]
    pub json_schema: Option<String>,
    /// The reply follows the JSON Schema in this file.
    #[arg(long = "json-schema-file", value_name = "FILE")]
    pub json_schema_file: Option<PathBuf>,
    /// The reply follows this GBNF grammar (llama.cpp's format; a text starting with
    /// `%llguidance` is read as llguidance Lark).
    #[arg(long = "grammar", value_name = "GBNF")]
    pub grammar: Option<String>,
    /// The reply follows the GBNF grammar in this file.
    #[arg(long = "grammar-file", value_name = "FILE")]
    pub grammar_file: Option<PathBuf>,
    /// The whole reply matches this regular expression (Rust regex syntax).
    #[arg(long = "regex", value_name = "REGEX")]
    pub regex: Option<String>,
}

impl ConstraintArgs {
    /// The spec the flags ask for; two or more flags are refused together.
    pub fn spec(&self) -> anyhow::Result<Option<ConstraintSpec>> {
        let given: Vec<&str> = [
            (self.json_schema.is_some(), "--json-schema"),
            (self.json_schema_file.is_some(), "--json-schema-file"),
            (self.grammar.is_some(), "--grammar"),
            (self.grammar_file.is_some(), "--grammar-file"),
            (self.regex.is_some(), "--regex"),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| n)
        .collect();
        if given.len() > 1 {
            bail!(
                "{} each constrain the reply; give only one of them",
                given.join(" and ")
            );
        }
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
        };
        let schema = |text: &str, from: &str| -> anyhow::Result<ConstraintSpec> {
            let v: serde_json::Value =
                serde_json::from_str(text).with_context(|| format!("{from} is not valid JSON"))?;
            Ok(ConstraintSpec::JsonSchema(v))
        };
        // llama.cpp's convention: a grammar opening with `%llguidance` is llguidance Lark
        // (the directive is llguidance's own and stays in the text).
        let grammar = |text: String| {
            if text.trim_start().starts_with("%llguidance") {
                ConstraintSpec::Lark(text)
            } else {
                ConstraintSpec::Gbnf(text)
            }
        };
        Ok(Some(if let Some(s) = &self.json_schema {
            schema(s, "--json-schema")?
        } else if let Some(p) = &self.json_schema_file {
            schema(&read(p)?, &format!("--json-schema-file {}", p.display()))?
        } else if let Some(g) = &self.grammar {
            grammar(g.clone())
        } else if let Some(p) = &self.grammar_file {
            grammar(read(p)?)
        } else if let Some(r) = &self.regex {
            ConstraintSpec::Regex(r.clone())
        } else {
            return Ok(None);
        }))
    }

    /// Compiles the constraint for the model's vocabulary (None without a flag); prints the
    /// compile time on stderr.
    pub fn compile(&self, tok: &Tokenizer) -> anyhow::Result<Option<Grammar>> {
        let Some(spec) = self.spec()? else {
            return Ok(None);
        };
        let t0 = std::time::Instant::now();
        let grammars = Grammars::new(tok)?;
        let trie_ms = t0.elapsed().as_secs_f64() * 1e3;
        let g = grammars.compile(&spec)?;
        eprintln!(
            "constraint: {} compiled in {:.1} ms (token trie {:.1} ms)",
            spec.kind(),
            g.compile_ms(),
            trie_ms
        );
        Ok(Some(g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        c: ConstraintArgs,
    }

    fn spec(args: &[&str]) -> anyhow::Result<Option<ConstraintSpec>> {
        T::try_parse_from(std::iter::once("t").chain(args.iter().copied()))?
            .c
            .spec()
    }

    #[test]
    fn each_flag_gives_its_spec() {
        assert_eq!(spec(&[]).unwrap(), None);
        assert_eq!(
            spec(&["--json-schema", "{\"type\":\"object\"}"]).unwrap(),
            Some(ConstraintSpec::JsonSchema(
                serde_json::json!({"type": "object"})
            ))
        );
        assert_eq!(
            spec(&["--grammar", "root ::= \"a\""]).unwrap(),
            Some(ConstraintSpec::Gbnf("root ::= \"a\"".into()))
        );
        assert_eq!(
            spec(&["--grammar", "%llguidance {}\nstart: \"a\""]).unwrap(),
            Some(ConstraintSpec::Lark("%llguidance {}\nstart: \"a\"".into()))
        );
        assert_eq!(
            spec(&["--regex", "[0-9]+"]).unwrap(),
            Some(ConstraintSpec::Regex("[0-9]+".into()))
        );
    }

    #[test]
    fn two_constraints_are_refused_together_and_bad_json_is_named() {
        let e = spec(&["--regex", "a", "--grammar", "root ::= \"a\""])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--grammar and --regex"), "{e}");
        let e = spec(&["--json-schema", "{nope"]).unwrap_err().to_string();
        assert!(e.contains("--json-schema is not valid JSON"), "{e}");
        let e = spec(&["--grammar-file", "/nonexistent/x.gbnf"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/x.gbnf"), "{e}");
    }
}
