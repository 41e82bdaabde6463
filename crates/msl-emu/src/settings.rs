//! The emulator's knobs (docs/SETTINGS.md), read into [`EmuSettings`], which the engine's
//! settings hold and hand to [`crate::EmuDevice::with_settings`] by value.

/// What the emulator answers when asked for its free memory (`MINFER_EMU_MEM`): its buffers
/// are host memory, so by default the host's available memory; a fixed figure proves layer
/// offload's budget on a machine of any size, and `fail` proves the refusal of a failed query.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EmuMemory {
    /// The host's `MemAvailable` (/proc/meminfo).
    #[default]
    Host,
    /// This many bytes.
    Bytes(u64),
    /// The query fails (`MINFER_EMU_MEM=fail`).
    Fail,
    /// A value that is neither a size nor `fail`: the query fails naming the variable.
    Invalid,
}

/// A size as `--gpu-mem` and `MINFER_EMU_MEM` write it: bytes, or a number with K, M, G or T
/// (binary units, an optional trailing `B`/`iB`), e.g. `3G`, `512M`, `1.5G`.
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim().to_ascii_uppercase();
    let t = t
        .strip_suffix("IB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(&t);
    let (num, mul) = match t.chars().last()? {
        'K' => (&t[..t.len() - 1], 1u64 << 10),
        'M' => (&t[..t.len() - 1], 1 << 20),
        'G' => (&t[..t.len() - 1], 1 << 30),
        'T' => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mul);
    }
    let x = num
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0)?;
    let b = x * mul as f64;
    (b < u64::MAX as f64).then_some(b as u64)
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmuSettings {
    /// Worker threads of a new device (`MINFER_EMU_THREADS`, a positive number; None: the
    /// machine's available parallelism). Not refused: another value is None, as it always was.
    pub threads: Option<usize>,
    /// The free memory the device reports (`MINFER_EMU_MEM`: a size, or `fail`; unset: the
    /// host's available memory). A value that is neither fails the query, naming it.
    pub memory: EmuMemory,
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
            memory: match var("MINFER_EMU_MEM") {
                None => EmuMemory::Host,
                Some(v) if v.trim().eq_ignore_ascii_case("fail") => EmuMemory::Fail,
                Some(v) => parse_size(&v).map_or(EmuMemory::Invalid, EmuMemory::Bytes),
            },
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

    /// Sizes in the units `--gpu-mem` takes; the control: text, a bare unit and an overflow
    /// are no size, and a bad `MINFER_EMU_MEM` is `Invalid` (never the host's figure).
    #[test]
    fn sizes_and_the_memory_knob() {
        assert_eq!(parse_size("3G"), Some(3 << 30));
        assert_eq!(parse_size(" 512m "), Some(512 << 20));
        assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("2kb"), Some(2048));
        for bad in ["", "G", "many", "-1G", "99999999999T"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
        let mem = |v: Option<&str>| EmuSettings::from_lookup(|_| v.map(str::to_string)).memory;
        assert_eq!(mem(None), EmuMemory::Host);
        assert_eq!(mem(Some("64M")), EmuMemory::Bytes(64 << 20));
        assert_eq!(mem(Some("FAIL")), EmuMemory::Fail);
        assert_eq!(mem(Some("lots")), EmuMemory::Invalid);
    }
}
