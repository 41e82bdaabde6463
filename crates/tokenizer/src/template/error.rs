//! Errors of chat-template loading and rendering.

use std::fmt;

/// Where in the template source an error happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceLine {
    /// 1-based line number.
    pub line: usize,
    /// That line of the template, trimmed.
    pub text: String,
}

impl fmt::Display for SourceLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "template line {}: `{}`", self.line, self.text)
    }
}

/// Displays an optional location as `" at template line N: `...`"`.
pub struct At<'a>(pub &'a Option<SourceLine>);

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(l) => write!(f, " at {l}"),
            None => f.write_str(" (no line information)"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The template does not compile: a syntax error or a construct minijinja lacks.
    #[error("chat template does not parse: {detail}{}", At(.at))]
    Parse {
        detail: String,
        at: Option<SourceLine>,
    },
    /// The template compiled but rendering failed (unknown filter, bad operand types, ...).
    #[error("chat template fails to render: {detail}{}", At(.at))]
    Render {
        detail: String,
        at: Option<SourceLine>,
    },
    /// The template called `raise_exception(message)`: it refuses these messages.
    #[error("chat template raised an exception: {message}{}", At(.at))]
    Raised {
        message: String,
        at: Option<SourceLine>,
    },
    /// A message that cannot be handed to the template.
    #[error("message with role {role:?} {detail}")]
    Message { role: String, detail: String },
    /// `tokenizer.chat_template` exists but is not a string.
    #[error("GGUF key {key} is a {found}, expected a string")]
    NotAString { key: String, found: &'static str },
    /// A special-token id the template needs is outside the vocabulary.
    #[error("GGUF key {key} = {id} is outside the vocabulary of {n_vocab} tokens")]
    BadTokenId {
        key: String,
        id: u64,
        n_vocab: usize,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
