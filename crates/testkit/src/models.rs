//! The real demo models, when they are cached.
//!
//! The directory is the one `minfer pull` fills (`minfer_hub::models_dir`, checked
//! equal in this crate's tests): `$MINFER_MODELS`, else `$XDG_CACHE_HOME/minfer/models`, else
//! `$HOME/.cache/minfer/models` (an empty variable counts as unset). The lookup is made when
//! called, so a test binary run elsewhere (scripts/avx512-remote-check) reads its own
//! environment.
//!
//! A test that needs a model starts with
//! `let Some(path) = models::qwen() else { return };`: when the file is absent the kit has
//! already printed the `SKIP:` line.

use std::path::PathBuf;

/// File name of the default demo model, Qwen2.5-Coder 0.5B Instruct, Q4_K_M.
pub const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
/// File name of the small demo model, SmolLM2 135M Instruct, Q4_1.
pub const SMOL: &str = "smollm2-135m-instruct-q4_1.gguf";

/// Every known real model: its `minfer pull` name and its file name.
pub const KNOWN: [(&str, &str); 2] = [("qwen2.5-coder-0.5b", QWEN), ("smollm2-135m", SMOL)];

/// The cached Qwen demo model, or `None` after printing the SKIP line.
pub fn qwen() -> Option<PathBuf> {
    find(QWEN)
}

/// The cached SmolLM2 demo model, or `None` after printing the SKIP line.
pub fn smol() -> Option<PathBuf> {
    find(SMOL)
}

/// The models directory (whether or not it exists); `None` when no variable names one.
pub fn dir() -> Option<PathBuf> {
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = nonempty("MINFER_MODELS") {
        return Some(d.into());
    }
    if let Some(d) = nonempty("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("minfer/models"));
    }
    nonempty("HOME").map(|h| PathBuf::from(h).join(".cache/minfer/models"))
}

/// `file` in the models directory if it is there, silently.
pub fn path(file: &str) -> Option<PathBuf> {
    let p = dir()?.join(file);
    p.is_file().then_some(p)
}

/// `file` in the models directory, or `None` after printing
/// `SKIP: <file> not in <dir> (set MINFER_MODELS or run `minfer pull <name>`)`.
pub fn find(file: &str) -> Option<PathBuf> {
    let found = path(file);
    if found.is_none() {
        println!("{}", skip_line(file));
    }
    found
}

/// The SKIP line for an absent `file`.
fn skip_line(file: &str) -> String {
    let pull = match KNOWN.iter().find(|(_, f)| *f == file) {
        Some((name, _)) => format!("minfer pull {name}"),
        None => "minfer pull".to_string(),
    };
    let place = match dir() {
        Some(d) => d.display().to_string(),
        None => "any models directory (no MINFER_MODELS, XDG_CACHE_HOME or HOME)".to_string(),
    };
    format!("SKIP: {file} not in {place} (set MINFER_MODELS or run `{pull}`)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_line_names_the_file_and_how_to_get_it() {
        let line = skip_line(SMOL);
        assert!(line.starts_with("SKIP: smollm2-135m-instruct-q4_1.gguf not in "));
        assert!(line.ends_with("(set MINFER_MODELS or run `minfer pull smollm2-135m`)"));
        assert!(skip_line("other.gguf").ends_with("run `minfer pull`)"));
    }

    #[test]
    fn a_file_not_there_is_none() {
        assert_eq!(path("no-such-model-minfer-testkit.gguf"), None);
        assert_eq!(find("no-such-model-minfer-testkit.gguf"), None);
    }
}
