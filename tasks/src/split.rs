//! Which half of the generated evaluation data a run draws from.

use serde::{Deserialize, Serialize};

/// `validation`: its own seeds, sentence forms, names and filler; prompts and settings
/// are chosen on it. `test`: the benchmark's own forms, only ever reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalSplit {
    Validation,
    Test,
}

impl std::str::FromStr for EvalSplit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "validation" => Ok(Self::Validation),
            "test" => Ok(Self::Test),
            other => Err(format!(
                "unknown split `{other}`; expected validation or test"
            )),
        }
    }
}

impl std::fmt::Display for EvalSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Validation => "validation",
            Self::Test => "test",
        })
    }
}
