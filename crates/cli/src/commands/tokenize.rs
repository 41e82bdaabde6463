//! `minfer tokenize -m MODEL [TEXT]`: the token ids (and pieces) of TEXT or of stdin, like
//! llama.cpp's tokenizer tool; `--decode` turns ids (TEXT or stdin) back into text.

use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use minfer_gguf::GgufFile;
use minfer_tokenizer::{Normalization, Tokenizer};
use serde_json::json;
use std::io::{Read, Write};
use std::path::PathBuf;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The GGUF model whose vocabulary to use (a path, a known name or hf:OWNER/REPO[:TAG];
    /// default: the demo model, as every command).
    #[arg(short, long, default_value = super::args::DEFAULT_MODEL)]
    pub model: PathBuf,
    /// The text (or, with --decode, the ids); read from stdin when absent.
    pub text: Option<String>,
    /// Match control tokens such as <|im_start|> written in the text as single ids.
    #[arg(long)]
    pub parse_special: bool,
    /// Add BOS/EOS when the vocabulary asks for them.
    #[arg(long)]
    pub add_special: bool,
    /// Normalize to Unicode NFC first (HF `tokenizers` behaviour; llama.cpp does not).
    #[arg(long)]
    pub nfc: bool,
    /// Decode: the input is token ids (a JSON array or numbers separated by spaces/commas).
    #[arg(long)]
    pub decode: bool,
    /// Emit JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

fn read_input(text: Option<String>) -> anyhow::Result<Vec<u8>> {
    match text {
        Some(t) => Ok(t.into_bytes()),
        None => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read stdin")?;
            Ok(buf)
        }
    }
}

fn parse_ids(input: &[u8]) -> anyhow::Result<Vec<u32>> {
    let text = std::str::from_utf8(input).context("ids are not UTF-8 text")?;
    let mut ids = Vec::new();
    for item in text
        .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|s| !s.is_empty())
    {
        match item.parse::<u32>() {
            Ok(id) => ids.push(id),
            Err(_) => bail!("{item:?} is not a token id"),
        }
    }
    Ok(ids)
}

/// A piece as one line: newlines, tabs, backslashes and other control characters escaped.
fn escape_piece(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for c in p.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
    out
}

pub fn run(args: Args) -> anyhow::Result<()> {
    super::args::not_a_directory(&args.model, "-m")?;
    let path = super::args::model_file(&args.model)?;
    let file =
        GgufFile::open(&path).with_context(|| format!("cannot open {}", args.model.display()))?;
    let mut tok = Tokenizer::from_metadata(&file.header().metadata)
        .with_context(|| format!("cannot build the tokenizer of {}", args.model.display()))?;
    if args.nfc {
        tok = tok.with_normalization(Normalization::Nfc);
    }
    let input = read_input(args.text)?;
    let mut out = std::io::stdout().lock();
    if args.decode {
        let ids = parse_ids(&input)?;
        let bytes = tok.decode(&ids)?;
        if args.json {
            let text = String::from_utf8_lossy(&bytes);
            writeln!(out, "{}", json!({ "text": text }))?;
        } else {
            out.write_all(&bytes)?;
        }
        return Ok(());
    }
    let mut ids = Vec::new();
    if args.add_special && tok.add_bos() {
        ids.extend(tok.special_ids().bos);
    }
    ids.extend(tok.encode_bytes(&input, args.parse_special)?);
    if args.add_special && tok.add_eos() {
        ids.extend(tok.special_ids().eos);
    }
    let pieces: Vec<String> = ids
        .iter()
        .map(|&id| {
            tok.piece(id)
                .map(|p| String::from_utf8_lossy(p).into_owned())
        })
        .collect::<Result<_, _>>()?;
    if args.json {
        let v = json!({ "n_tokens": ids.len(), "ids": ids, "pieces": pieces });
        writeln!(out, "{v}")?;
    } else {
        // Control characters escaped (`\n`, `\t`, `\u{1b}`), so one token is one line.
        for (id, piece) in ids.iter().zip(&pieces) {
            writeln!(out, "{id:>6} -> '{}'", escape_piece(piece))?;
        }
    }
    Ok(())
}
