//! Engine knobs declared once: the `knobs!` macro turns one list of documented
//! fields into the config struct, its defaults, and the table of `serve` flags
//! (flag, TOML key, help, how the flag's text becomes a value) that the server's
//! command line and the docs' table are generated from.

use std::sync::OnceLock;

/// How a flag's text becomes the TOML value of its key.
#[derive(Debug, Clone, Copy)]
pub enum KnobValue {
    /// Takes a value: `--flag VALUE`, parsed by the function (errors say why).
    Parse {
        parse: fn(&str) -> Result<toml::Value, String>,
        /// Shown in `--help` (e.g. `N`, `MS`, `BYTES`).
        name: &'static str,
    },
    /// Takes no value: present sets the key to this boolean.
    Switch(bool),
}

/// One knob of one struct, as its declaration gives it.
#[derive(Debug, Clone, Copy)]
pub struct Knob {
    /// The field's name (its TOML key within its struct).
    pub key: &'static str,
    /// The flag, without `--`.
    pub flag: &'static str,
    /// The field's doc comment, one line per doc line.
    pub doc: &'static str,
    pub value: KnobValue,
}

/// One `serve` flag: the knob, and the full dotted TOML keys it sets (several when
/// one flag sets a knob of both classes).
#[derive(Debug, Clone)]
pub struct Flag {
    pub flag: String,
    pub keys: Vec<String>,
    /// The doc comment as one paragraph, with what the scope adds.
    pub help: String,
    pub value: KnobValue,
}

impl Flag {
    /// `keys` as a TOML table setting each to `v`.
    pub fn overrides(&self, v: &toml::Value, out: &mut toml::Table) {
        for key in &self.keys {
            let mut parts: Vec<&str> = key.split('.').collect();
            let last = parts.pop().unwrap_or_default();
            let mut t = &mut *out;
            for p in parts {
                let e = t
                    .entry(p.to_string())
                    .or_insert_with(|| toml::Value::Table(Default::default()));
                if !e.is_table() {
                    *e = toml::Value::Table(Default::default());
                }
                let toml::Value::Table(next) = e else {
                    unreachable!("made a table above")
                };
                t = next;
            }
            t.insert(last.to_string(), v.clone());
        }
    }

    /// The value a present switch or a given text means.
    pub fn parse(&self, text: Option<&str>) -> Result<toml::Value, String> {
        match (self.value, text) {
            (KnobValue::Switch(b), _) => Ok(toml::Value::Boolean(b)),
            (KnobValue::Parse { parse, .. }, Some(t)) => parse(t),
            (KnobValue::Parse { .. }, None) => Err(format!("--{} needs a value", self.flag)),
        }
    }
}

/// Every `serve` flag of the engine, in declaration order; built once.
pub fn flags() -> &'static [Flag] {
    static FLAGS: OnceLock<Vec<Flag>> = OnceLock::new();
    FLAGS.get_or_init(|| {
        use crate::config::{AdmissionConfig, ClassLimits, EngineConfig};
        let mut v = Vec::new();
        scoped(&mut v, &EngineConfig::knobs(), "", &[""], "");
        scoped(&mut v, &AdmissionConfig::knobs(), "", &["admission."], "");
        let both = ["admission.interactive.", "admission.batch."];
        scoped(&mut v, &ClassLimits::knobs(), "", &both, " (both classes)");
        let batch = ["admission.batch."];
        scoped(
            &mut v,
            &ClassLimits::knobs(),
            "batch-",
            &batch,
            " (the batch class alone; wins over the flag for both)",
        );
        v
    })
}

fn scoped(
    out: &mut Vec<Flag>,
    knobs: &[Knob],
    flag_prefix: &str,
    key_prefixes: &[&str],
    scope: &str,
) {
    for k in knobs {
        let help = k
            .doc
            .split('\n')
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        let help = match help.strip_suffix('.') {
            Some(h) if !scope.is_empty() => format!("{h}{scope}."),
            _ => format!("{help}{scope}"),
        };
        out.push(Flag {
            flag: format!("{flag_prefix}{}", k.flag),
            keys: key_prefixes
                .iter()
                .map(|p| format!("{p}{}", k.key))
                .collect(),
            help,
            value: k.value,
        });
    }
}

/// How a field type's flag text is read.
pub trait KnobType {
    const VALUE: KnobValue;
}

fn int(s: &str) -> Result<toml::Value, String> {
    s.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| i64::try_from(n).ok())
        .map(toml::Value::Integer)
        .ok_or_else(|| format!("'{s}' is not a whole number >= 0"))
}

fn float(s: &str) -> Result<toml::Value, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(toml::Value::Float(x)),
        _ => Err(format!("'{s}' is not a number")),
    }
}

/// "512MiB" -> 536870912 (suffixes KiB, MiB, GiB and K, M, G).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = [
        ("GiB", 1u64 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ]
    .iter()
    .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n, *m)))
    .unwrap_or((t, 1));
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| format!("'{s}' is not a byte count (e.g. 536870912, 512MiB, 2GiB)"))
}

fn bytes(s: &str) -> Result<toml::Value, String> {
    parse_bytes(s).map(|n| toml::Value::Integer(n as i64))
}

/// A value by its `FromStr`, stored as its TOML (serde) form.
fn text<T: std::str::FromStr<Err = String> + serde::Serialize>(
    s: &str,
) -> Result<toml::Value, String> {
    let v: T = s.parse()?;
    toml::Value::try_from(v).map_err(|e| e.to_string())
}

impl KnobType for usize {
    const VALUE: KnobValue = KnobValue::Parse {
        parse: int,
        name: "N",
    };
}
impl KnobType for u64 {
    const VALUE: KnobValue = KnobValue::Parse {
        parse: int,
        name: "N",
    };
}
impl KnobType for f64 {
    const VALUE: KnobValue = KnobValue::Parse {
        parse: float,
        name: "X",
    };
}
impl<T: KnobType> KnobType for Option<T> {
    const VALUE: KnobValue = T::VALUE;
}
impl KnobType for crate::request::SloClass {
    const VALUE: KnobValue = KnobValue::Parse {
        parse: text::<Self>,
        name: "interactive|batch",
    };
}
impl KnobType for crate::config::StepBudgetPolicy {
    const VALUE: KnobValue = KnobValue::Parse {
        parse: text::<Self>,
        name: "time|tokens",
    };
}

impl KnobType for std::path::PathBuf {
    const VALUE: KnobValue = KnobValue::Parse {
        parse: path,
        name: "PATH",
    };
}

fn path(s: &str) -> Result<toml::Value, String> {
    match s.trim() {
        "" => Err("an empty path".into()),
        p => Ok(toml::Value::String(p.to_string())),
    }
}

impl KnobType for crate::config::KvCacheType {
    const VALUE: KnobValue = KnobValue::Parse {
        parse: text::<Self>,
        name: "f16|q8_0|q4_0",
    };
}

/// The byte-count reading of a `u64` knob (`[flag "..." bytes]`).
pub const BYTES: KnobValue = KnobValue::Parse {
    parse: bytes,
    name: "BYTES",
};

/// Declares a config struct once: each field with its doc comment, type and
/// default, and, for those a flag sets, `[flag "name"]` (`[flag "name" bytes]` for
/// a byte count, `[flag "no-x" off]` for a switch that turns a bool off). Yields the
/// struct, `Default`, and `knobs()` (the flagged fields, in order).
#[macro_export]
macro_rules! knobs {
    (
        $(#[$sattr:meta])*
        pub struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                $([flag $flag:literal $($how:ident)?])?
                pub $field:ident : $ty:ty = $default:expr,
            )*
        }
    ) => {
        $(#[$sattr])*
        pub struct $name {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                $name { $( $field: $default, )* }
            }
        }

        impl $name {
            /// The fields a `serve` flag sets, as declared.
            // Fields without a flag push nothing: no `vec![]` literal fits.
            #[allow(clippy::vec_init_then_push)]
            pub fn knobs() -> Vec<$crate::knobs::Knob> {
                let mut v = Vec::new();
                $( $crate::knob_push!(v, [$($doc),*], $field, $ty, $default $(, $flag $(, $how)?)?); )*
                v
            }
        }
    };
}

/// One field's `Knob`, pushed when it has a flag.
#[macro_export]
macro_rules! knob_push {
    ($v:ident, [$($doc:literal),*], $field:ident, $ty:ty, $default:expr) => {};
    ($v:ident, [$($doc:literal),*], $field:ident, $ty:ty, $default:expr, $flag:literal $(, $how:ident)?) => {
        $v.push($crate::knobs::Knob {
            key: stringify!($field),
            flag: $flag,
            doc: concat!($($doc, "\n"),*),
            value: $crate::knob_value!($ty $(, $how)?),
        });
    };
}

/// The `KnobValue` of a field (its type's, or the marker's).
#[macro_export]
macro_rules! knob_value {
    ($ty:ty) => {
        <$ty as $crate::knobs::KnobType>::VALUE
    };
    ($ty:ty, bytes) => {
        $crate::knobs::BYTES
    };
    ($ty:ty, off) => {
        $crate::knobs::KnobValue::Switch(false)
    };
}

/// The flags as a markdown table (flag, TOML key, default, meaning), as
/// docs/serving.md holds it between its `knobs` markers.
pub fn markdown_table() -> String {
    let defaults =
        toml::Table::try_from(crate::config::EngineConfig::default()).unwrap_or_default();
    let lookup = |key: &str| {
        let mut v: Option<&toml::Value> = None;
        let mut t = Some(&defaults);
        for part in key.split('.') {
            v = t.and_then(|t| t.get(part));
            t = v.and_then(|v| v.as_table());
        }
        v.map_or("unset".to_string(), |v| format!("`{v}`"))
    };
    let mut s = String::from("| flag | TOML key | default | meaning |\n|---|---|---|---|\n");
    for f in flags() {
        let flag = match f.value {
            KnobValue::Switch(_) => format!("`--{}`", f.flag),
            KnobValue::Parse { name, .. } => format!("`--{} {name}`", f.flag).replace('|', "\\|"),
        };
        let keys: Vec<String> = f.keys.iter().map(|k| format!("`{k}`")).collect();
        let default: Vec<String> = f.keys.iter().map(|k| lookup(k)).collect();
        let default = default.join(", ");
        let help = f.help.replace('|', "\\|");
        s.push_str(&format!(
            "| {flag} | {} | {default} | {help} |\n",
            keys.join(", ")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EngineConfig;

    #[test]
    fn every_flag_is_unique_and_sets_a_real_key() {
        let mut seen = std::collections::BTreeSet::new();
        let base = toml::Table::try_from(EngineConfig::default()).unwrap();
        for f in flags() {
            assert!(seen.insert(f.flag.clone()), "flag --{} twice", f.flag);
            assert!(!f.help.is_empty(), "--{} has no help", f.flag);
            let v = match f.value {
                KnobValue::Switch(b) => toml::Value::Boolean(b),
                // The default where there is one, else a small number.
                KnobValue::Parse { parse, .. } => {
                    let mut v = None;
                    let mut t = Some(&base);
                    for part in f.keys[0].split('.') {
                        v = t.and_then(|t| t.get(part)).cloned();
                        t = t.and_then(|t| t.get(part)).and_then(|v| v.as_table());
                    }
                    v.unwrap_or_else(|| parse("1").unwrap())
                }
            };
            let mut over = toml::Table::new();
            f.overrides(&v, &mut over);
            let mut t = base.clone();
            crate::config::merge_toml(&mut t, over);
            // Unknown keys are errors (deny_unknown_fields): the key is real.
            let _: EngineConfig = t.try_into().unwrap_or_else(|e| panic!("--{}: {e}", f.flag));
        }
        assert!(seen.contains("max-num-seqs") && seen.contains("batch-max-waiting-requests"));
    }

    #[test]
    fn flag_text_is_read_by_the_field_type() {
        let find = |n: &str| flags().iter().find(|f| f.flag == n).unwrap();
        assert_eq!(
            find("kv-cache-memory")
                .parse(Some("64MiB"))
                .unwrap()
                .as_integer(),
            Some(64 << 20)
        );
        assert!(find("max-num-seqs").parse(Some("-1")).is_err());
        assert!(find("slo-margin").parse(Some("nan")).is_err());
        assert!(find("default-slo-class")
            .parse(Some("gold"))
            .unwrap_err()
            .contains("gold"));
        assert_eq!(
            find("no-prefix-cache").parse(None).unwrap().as_bool(),
            Some(false)
        );
        let mut t = toml::Table::new();
        find("max-waiting-requests").overrides(&toml::Value::Integer(3), &mut t);
        let c = EngineConfig::default().with_overrides(t).unwrap();
        assert_eq!(c.admission.interactive.max_waiting_requests, 3);
        assert_eq!(c.admission.batch.max_waiting_requests, 3);
        assert_eq!(
            find("kv-cache-type").parse(Some("q8_0")).unwrap().as_str(),
            Some("q8_0")
        );
        assert!(find("kv-cache-type").parse(Some("q5_1")).is_err());
        assert!(parse_bytes("12x").is_err());
        assert!(parse_bytes("99999999999G").is_err());
    }
}
