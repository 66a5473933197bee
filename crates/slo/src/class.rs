//! [`SloClass`]: the service class a request runs as.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize};

/// Service class of a request. `Interactive` requests are admitted and prefilled
/// before `Batch` ones and may preempt them; when no batch work runs at all, a batch
/// request that waited `batch_aging_ms` ages into interactive priority, so batch
/// work never starves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SloClass {
    #[default]
    Interactive,
    Batch,
}

impl SloClass {
    /// Both classes, highest priority first.
    pub const ALL: [SloClass; 2] = [SloClass::Interactive, SloClass::Batch];

    /// Dense index (0 interactive, 1 batch) for per-class arrays.
    #[inline]
    pub fn index(self) -> usize {
        match self {
            SloClass::Interactive => 0,
            SloClass::Batch => 1,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SloClass::Interactive => "interactive",
            SloClass::Batch => "batch",
        }
    }
}

impl fmt::Display for SloClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Case-insensitive, surrounding blanks ignored.
impl FromStr for SloClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "interactive" => Ok(SloClass::Interactive),
            "batch" => Ok(SloClass::Batch),
            _ => Err(format!(
                "unknown SLO class '{}' (expected 'interactive' or 'batch')",
                s.trim()
            )),
        }
    }
}

/// From a string, as [`FromStr`] reads it (request bodies, profiles, configs).
impl<'de> Deserialize<'de> for SloClass {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_any_case_and_refuses_others() {
        assert_eq!(" Batch ".parse::<SloClass>(), Ok(SloClass::Batch));
        assert_eq!("INTERACTIVE".parse::<SloClass>(), Ok(SloClass::Interactive));
        let e = "bulk".parse::<SloClass>().unwrap_err();
        assert!(e.contains("'bulk'") && e.contains("'batch'"), "{e}");
    }

    #[test]
    fn index_matches_all() {
        for (i, c) in SloClass::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
            assert_eq!(c.as_str().parse::<SloClass>(), Ok(*c));
        }
    }
}
