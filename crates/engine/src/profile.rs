//! Profiles: named starting configurations (`interactive`, `batch`, `mixed`) kept as
//! data in `crates/engine/profiles.toml`, embedded at build time.

use crate::config::EngineConfig;
use crate::error::EngineError;

/// The built-in profile file.
pub const BUILTIN_PROFILES: &str = include_str!("../profiles.toml");

/// Access to named profiles. A profile is a TOML table of `EngineConfig` keys laid
/// over the defaults; callers then override field by field.
pub struct Profile;

fn parse(text: &str) -> Result<toml::Table, EngineError> {
    toml::from_str(text).map_err(|e| EngineError::InvalidConfig(format!("profiles: {e}")))
}

impl Profile {
    /// Names of the built-in profiles, sorted.
    pub fn names() -> Vec<String> {
        Self::names_in(BUILTIN_PROFILES).unwrap_or_default()
    }

    /// The built-in profile `name` as a full configuration.
    pub fn load(name: &str) -> Result<EngineConfig, EngineError> {
        Self::load_from(BUILTIN_PROFILES, name)
    }

    /// One-line description of a built-in profile.
    pub fn describe(name: &str) -> Option<String> {
        let all = parse(BUILTIN_PROFILES).ok()?;
        all.get(name)?
            .get("description")?
            .as_str()
            .map(str::to_owned)
    }

    /// Profile names defined in a profiles TOML text.
    pub fn names_in(text: &str) -> Result<Vec<String>, EngineError> {
        let mut names: Vec<String> = parse(text)?.keys().cloned().collect();
        names.sort();
        Ok(names)
    }

    /// Profile `name` from a profiles TOML text, laid over `EngineConfig::default()`.
    pub fn load_from(text: &str, name: &str) -> Result<EngineConfig, EngineError> {
        let mut all = parse(text)?;
        let Some(toml::Value::Table(mut table)) = all.remove(name) else {
            let names = Self::names_in(text)?.join(", ");
            return Err(EngineError::InvalidConfig(format!(
                "unknown profile '{name}' (known: {names})"
            )));
        };
        table.remove("description");
        EngineConfig::default().with_overrides(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::SloClass;

    #[test]
    fn builtin_profiles_load() {
        assert_eq!(Profile::names(), vec!["batch", "interactive", "mixed"]);
        let i = Profile::load("interactive").unwrap();
        let b = Profile::load("batch").unwrap();
        let m = Profile::load("mixed").unwrap();
        assert!(i.max_num_seqs < b.max_num_seqs);
        assert!(i.max_prefill_chunk < b.max_prefill_chunk);
        assert!(i.enable_prefix_cache);
        assert!(!b.slo_classes && b.default_slo_class == SloClass::Batch);
        assert!(m.slo_classes && m.enable_preemption);
        assert!(Profile::describe("mixed").unwrap().contains("preempts"));
        assert!(Profile::load("nope")
            .unwrap_err()
            .to_string()
            .contains("known: batch"));
    }

    #[test]
    fn profile_then_overrides() {
        let c = Profile::load("interactive")
            .unwrap()
            .with_overrides_toml("max_num_seqs = 4")
            .unwrap();
        assert_eq!(c.max_num_seqs, 4);
        assert_eq!(c.max_prefill_chunk, 128);
    }
}
