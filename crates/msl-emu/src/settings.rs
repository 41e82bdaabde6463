//! The emulator's one knob (docs/SETTINGS.md), read into [`EmuSettings`], which the engine's
//! settings hold and hand to [`crate::EmuDevice::with_settings`] by value.

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmuSettings {
    /// Worker threads of a new device (`MINFER_EMU_THREADS`, a positive number; None: the
    /// machine's available parallelism). Not refused: another value is None, as it always was.
    pub threads: Option<usize>,
}

impl EmuSettings {
    /// The knob as this process's environment sets it.
    pub fn from_env() -> EmuSettings {
        EmuSettings::from_lookup(|k| std::env::var(k).ok())
    }

    /// The knob as `var` gives it (the environment, or a test's table).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> EmuSettings {
        EmuSettings {
            threads: var("MINFER_EMU_THREADS")
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&n| n > 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A positive number is taken; the control: unset, zero and text leave the default.
    #[test]
    fn threads_take_a_positive_number_only() {
        let with = |v: Option<&str>| EmuSettings::from_lookup(|_| v.map(str::to_string)).threads;
        assert_eq!(with(Some(" 3 ")), Some(3));
        for v in [None, Some("0"), Some("many"), Some("")] {
            assert_eq!(with(v), None, "{v:?}");
        }
    }
}
