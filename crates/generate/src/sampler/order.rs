//! The order of the chain's stages, as llama.cpp's `--samplers` (names separated by `;`)
//! and `--sampling-seq` (one letter a stage) spell it.

/// One configurable stage of the chain. Logit bias always runs first and the draw (or
/// mirostat) last; these are the stages in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Repeat / frequency / presence penalties (`e`).
    Penalties,
    /// DRY, "don't repeat yourself" (`d`).
    Dry,
    /// Top-n-σ (`s`).
    TopNSigma,
    /// Top-k (`k`).
    TopK,
    /// Locally typical sampling (`y`).
    TypicalP,
    /// Nucleus (`p`).
    TopP,
    /// Min-p (`m`).
    MinP,
    /// Exclude top choices (`x`).
    Xtc,
    /// Temperature (`t`).
    Temperature,
}

/// llama.cpp's default order (`common_params_sampling::samplers`).
pub const DEFAULT_ORDER: [Stage; 9] = [
    Stage::Penalties,
    Stage::Dry,
    Stage::TopNSigma,
    Stage::TopK,
    Stage::TypicalP,
    Stage::TopP,
    Stage::MinP,
    Stage::Xtc,
    Stage::Temperature,
];

/// Why an order string was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OrderError {
    #[error("sampler {0:?} is unknown (dry, top_k, typ_p, top_p, top_n_sigma, min_p, xtc, temperature, penalties)")]
    UnknownName(String),
    #[error("sampler {0:?} is llama.cpp's but minfer does not implement it")]
    Unsupported(String),
    #[error("sampler letter {0:?} is unknown (d k y p s m x t e)")]
    UnknownLetter(char),
    #[error("the sampler list is empty")]
    Empty,
}

impl Stage {
    /// The canonical name (llama.cpp's `common_sampler_type_to_str`).
    pub fn name(self) -> &'static str {
        match self {
            Stage::Penalties => "penalties",
            Stage::Dry => "dry",
            Stage::TopNSigma => "top_n_sigma",
            Stage::TopK => "top_k",
            Stage::TypicalP => "typ_p",
            Stage::TopP => "top_p",
            Stage::MinP => "min_p",
            Stage::Xtc => "xtc",
            Stage::Temperature => "temperature",
        }
    }

    pub fn letter(self) -> char {
        match self {
            Stage::Penalties => 'e',
            Stage::Dry => 'd',
            Stage::TopNSigma => 's',
            Stage::TopK => 'k',
            Stage::TypicalP => 'y',
            Stage::TopP => 'p',
            Stage::MinP => 'm',
            Stage::Xtc => 'x',
            Stage::Temperature => 't',
        }
    }

    /// A name as llama.cpp accepts it: canonical, kebab-case (`top-k`), without the
    /// underscore (`topk`), or the aliases `nucleus`, `temp`, `typ`.
    pub fn from_name(s: &str) -> Result<Stage, OrderError> {
        let folded: String = s.trim().to_ascii_lowercase().replace('-', "_");
        let plain = folded.replace('_', "");
        for st in DEFAULT_ORDER {
            if folded == st.name() || plain == st.name().replace('_', "") {
                return Ok(st);
            }
        }
        match plain.as_str() {
            "nucleus" => Ok(Stage::TopP),
            "temp" => Ok(Stage::Temperature),
            "typ" | "typical" | "typicalp" => Ok(Stage::TypicalP),
            "infill" | "adaptivep" => Err(OrderError::Unsupported(s.to_string())),
            _ => Err(OrderError::UnknownName(s.to_string())),
        }
    }

    pub fn from_letter(c: char) -> Result<Stage, OrderError> {
        match c {
            'i' | 'a' => Err(OrderError::Unsupported(c.to_string())),
            _ => DEFAULT_ORDER
                .into_iter()
                .find(|st| st.letter() == c)
                .ok_or(OrderError::UnknownLetter(c)),
        }
    }
}

/// `--samplers` / the server's `samplers` string: names separated by `;` (commas too).
pub fn parse_names(s: &str) -> Result<Vec<Stage>, OrderError> {
    let out: Vec<Stage> = s
        .split([';', ','])
        .filter(|p| !p.trim().is_empty())
        .map(Stage::from_name)
        .collect::<Result<_, _>>()?;
    if out.is_empty() {
        return Err(OrderError::Empty);
    }
    Ok(out)
}

/// `--sampling-seq`: one letter a stage, e.g. `edskypmxt`.
pub fn parse_letters(s: &str) -> Result<Vec<Stage>, OrderError> {
    let out: Vec<Stage> = s
        .trim()
        .chars()
        .map(Stage::from_letter)
        .collect::<Result<_, _>>()?;
    if out.is_empty() {
        return Err(OrderError::Empty);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_letters_follow_llama_cpp() {
        assert_eq!(
            parse_names("penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature")
                .unwrap(),
            DEFAULT_ORDER
        );
        assert_eq!(parse_letters("edskypmxt").unwrap(), DEFAULT_ORDER);
        assert_eq!(
            parse_names("top-k;minp;nucleus;temp;typ").unwrap(),
            [
                Stage::TopK,
                Stage::MinP,
                Stage::TopP,
                Stage::Temperature,
                Stage::TypicalP
            ]
        );
        assert_eq!(
            parse_letters("dkypmxt").unwrap(),
            [
                Stage::Dry,
                Stage::TopK,
                Stage::TypicalP,
                Stage::TopP,
                Stage::MinP,
                Stage::Xtc,
                Stage::Temperature
            ]
        );
    }

    #[test]
    fn unknown_and_unsupported_are_refused_by_name() {
        assert_eq!(
            parse_names("top_k;bogus"),
            Err(OrderError::UnknownName("bogus".into()))
        );
        assert_eq!(
            parse_names("infill"),
            Err(OrderError::Unsupported("infill".into()))
        );
        assert_eq!(parse_letters("kq"), Err(OrderError::UnknownLetter('q')));
        assert_eq!(parse_names(" ; "), Err(OrderError::Empty));
    }
}
