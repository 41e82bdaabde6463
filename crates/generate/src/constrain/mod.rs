//! Constrained decoding: replies that follow a JSON Schema, any JSON object, a Lark
//! grammar, a regular expression or a GBNF grammar, built on `llguidance` (ADR 0007).
//!
//! [`Grammars`] is made once per tokenizer: llguidance's token trie over our vocabulary
//! (each token's bytes as our detokenizer writes them; control, user-defined and unused
//! tokens marked special, so no grammar text can produce them). [`Grammars::compile`] turns
//! a [`ConstraintSpec`] into a [`Grammar`], refusing what llguidance refuses (an unsupported
//! schema keyword, a malformed grammar, an empty regex) before any token is generated.
//! [`Grammar::start`] gives one sequence's [`ConstraintState`]: a worker thread that owns
//! the matcher and computes the next token mask while the model runs its forward, so a
//! constrained token waits only when the mask takes longer than the forward.
//!
//! End of generation: llguidance allows its EOS only where the grammar accepts; we then
//! allow every end-of-generation id of the model, and none elsewhere.

mod gbnf;
mod worker;

pub use gbnf::{gbnf_to_lark, GbnfError};
pub use worker::{ConstraintState, ConstraintStats};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use minfer_tokenizer::{TokenType, Tokenizer};
use std::sync::Arc;
use std::time::Instant;

/// The byte that starts a special token's word for [`Grammars::from_words`] (no grammar
/// text can produce such a token).
pub const SPECIAL_TOKEN_MARKER: u8 = TokTrie::SPECIAL_TOKEN_MARKER;

/// What a reply must match.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// A JSON Schema (llguidance's coverage; refused keywords are named).
    JsonSchema(serde_json::Value),
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// llguidance's Lark dialect.
    Lark(String),
    /// A regular expression (Rust `regex` syntax) the whole reply matches.
    Regex(String),
    /// llama.cpp's GBNF, translated to Lark.
    Gbnf(String),
}

impl ConstraintSpec {
    pub fn kind(&self) -> &'static str {
        match self {
            ConstraintSpec::JsonSchema(_) => "JSON schema",
            ConstraintSpec::JsonObject => "JSON object",
            ConstraintSpec::Lark(_) => "Lark grammar",
            ConstraintSpec::Regex(_) => "regex",
            ConstraintSpec::Gbnf(_) => "GBNF grammar",
        }
    }
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConstraintError {
    /// llguidance refused the input; the message names the keyword or construct.
    #[error("the {kind} is refused: {message}")]
    Refused { kind: &'static str, message: String },
    #[error("the regex is empty (it would match only an empty reply)")]
    EmptyRegex,
    /// A syntax error in a regex, said before llguidance sees it (its message quotes the
    /// Lark grammar it wraps the regex in, with that grammar's line and column).
    #[error("the regex {regex:?} is refused: {what} at character {at}")]
    RegexSyntax {
        regex: String,
        what: String,
        /// 1-based, in characters.
        at: usize,
    },
    /// A JSON schema's `pattern` with a syntax error (said as for [`Self::RegexSyntax`]).
    #[error("the JSON schema is refused: its pattern {regex:?} has {what} at character {at}")]
    SchemaPattern {
        regex: String,
        what: String,
        /// 1-based, in characters.
        at: usize,
    },
    #[error("the GBNF grammar is refused: {0}")]
    Gbnf(#[from] GbnfError),
    #[error("cannot build the token trie: {0}")]
    Vocabulary(String),
}

/// llguidance set up for one vocabulary (cheap to share: clone the `Arc`).
pub struct Grammars {
    factory: ParserFactory,
    eog: Arc<[u32]>,
    n_vocab: usize,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("n_vocab", &self.n_vocab)
            .field("eog", &self.eog)
            .finish()
    }
}

/// The bytes the trie gives each token: its text, or a special marker then its name.
pub fn trie_words(tok: &Tokenizer) -> Vec<Vec<u8>> {
    (0..tok.n_vocab() as u32)
        .map(|id| match tok.token_type(id) {
            Ok(TokenType::Normal) | Ok(TokenType::Byte) | Ok(TokenType::Undefined) => {
                tok.piece(id).map(<[u8]>::to_vec).unwrap_or_default()
            }
            Ok(TokenType::Control) | Ok(TokenType::UserDefined) | Ok(TokenType::Unknown) => {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(tok.token_text(id).unwrap_or_default());
                w
            }
            Ok(TokenType::Unused) | Err(_) => Vec::new(),
        })
        .collect()
}

impl Grammars {
    /// Builds the trie from the tokenizer's vocabulary.
    pub fn new(tok: &Tokenizer) -> Result<Grammars, ConstraintError> {
        Self::from_words(trie_words(tok), tok.eog_ids())
    }

    /// From the trie's words directly (`words[id]`; tests use small vocabularies).
    pub fn from_words(words: Vec<Vec<u8>>, eog: &[u32]) -> Result<Grammars, ConstraintError> {
        let n_vocab = words.len();
        let eos = *eog.first().ok_or_else(|| {
            ConstraintError::Vocabulary("the model has no end-of-generation token".into())
        })?;
        let info = TokRxInfo::new(n_vocab as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Grammars {
            factory,
            eog: eog.into(),
            n_vocab,
        })
    }

    /// Compiles `spec`; every refusal happens here, before a token is generated.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<Grammar, ConstraintError> {
        let t0 = Instant::now();
        let refused = |message: String| ConstraintError::Refused {
            kind: spec.kind(),
            message,
        };
        let top = match spec {
            ConstraintSpec::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(json_options(schema.clone()))
            }
            ConstraintSpec::JsonObject => TopLevelGrammar::from_json_schema(json_options(
                serde_json::json!({"type": "object"}),
            )),
            ConstraintSpec::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
            ConstraintSpec::Regex(rx) => {
                if rx.is_empty() {
                    return Err(ConstraintError::EmptyRegex);
                }
                check_regex_syntax(rx)?;
                TopLevelGrammar::from_regex(rx)
            }
            ConstraintSpec::Gbnf(src) => TopLevelGrammar::from_lark(gbnf_to_lark(src)?),
        };
        let parser = self.factory.create_parser(top).map_err(|e| {
            // A schema's bad `pattern` is named the way a bad --regex is (llguidance's
            // message spans lines, the regex drawn with a caret); only once llguidance has
            // refused, so no pattern it takes is refused here.
            match spec {
                ConstraintSpec::JsonSchema(schema) => bad_pattern(schema),
                _ => None,
            }
            .unwrap_or_else(|| refused(e.to_string()))
        })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(refused(e));
        }
        Ok(Grammar {
            matcher,
            eog: self.eog.clone(),
            n_vocab: self.n_vocab,
            compile_ms: t0.elapsed().as_secs_f64() * 1e3,
        })
    }
}

/// The syntax of `rx` alone (its abstract syntax tree: no flags or Unicode tables, which
/// llguidance sets its own way and checks itself).
fn check_regex_syntax(rx: &str) -> Result<(), ConstraintError> {
    match regex_syntax::ast::parse::Parser::new().parse(rx) {
        Ok(_) => Ok(()),
        Err(e) => Err(ConstraintError::RegexSyntax {
            regex: rx.to_string(),
            what: e.kind().to_string(),
            at: rx[..e.span().start.offset].chars().count() + 1,
        }),
    }
}

/// The first `pattern` (or `patternProperties` key) in `schema` whose syntax is wrong, as
/// [`ConstraintError::SchemaPattern`].
fn bad_pattern(schema: &serde_json::Value) -> Option<ConstraintError> {
    use serde_json::Value;
    match schema {
        Value::Object(o) => {
            let own = o.get("pattern").and_then(Value::as_str).into_iter();
            let keys = o
                .get("patternProperties")
                .and_then(Value::as_object)
                .into_iter()
                .flat_map(|m| m.keys().map(String::as_str));
            own.chain(keys)
                .find_map(|rx| match check_regex_syntax(rx) {
                    Err(ConstraintError::RegexSyntax { regex, what, at }) => {
                        Some(ConstraintError::SchemaPattern { regex, what, at })
                    }
                    _ => None,
                })
                .or_else(|| o.values().find_map(bad_pattern))
        }
        Value::Array(a) => a.iter().find_map(bad_pattern),
        _ => None,
    }
}

fn json_options(mut schema: serde_json::Value) -> serde_json::Value {
    compact_json(&mut schema);
    schema
}

/// Sets a schema to compact JSON (`, ` and `: ` separators, no free whitespace): a small
/// model cannot spend its token budget on blank lines, and replies stay short. Also for
/// schemas inlined in Lark (`%json {...}`).
pub fn compact_json(schema: &mut serde_json::Value) {
    if schema.is_object() {
        JsonCompileOptions {
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            whitespace_flexible: false,
            ..JsonCompileOptions::default()
        }
        .apply_to(schema);
    }
}

/// A compiled constraint; each sequence starts its own state from it.
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
    eog: Arc<[u32]>,
    n_vocab: usize,
    compile_ms: f64,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("compile_ms", &self.compile_ms)
            .finish()
    }
}

impl Grammar {
    /// Milliseconds the compile took.
    pub fn compile_ms(&self) -> f64 {
        self.compile_ms
    }

    /// A fresh state (its own matcher on its own worker thread).
    pub fn start(&self) -> ConstraintState {
        ConstraintState::spawn(self.matcher.deep_clone(), self.eog.clone(), self.n_vocab)
    }

    /// Whether `tokens` are a complete reply under the grammar (llguidance's own matcher,
    /// from a fresh state): every token allowed in turn, and the end accepting.
    pub fn accepts_tokens(&self, tokens: &[u32]) -> bool {
        let mut m = self.matcher.deep_clone();
        tokens.iter().all(|&t| m.consume_token(t).is_ok()) && m.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod lookup_tests;
#[cfg(test)]
mod tests;
