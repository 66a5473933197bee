//! The engine's `serve` flags, generated from the knob declarations
//! (`sloserve_engine::knobs::flags`): each one's name, help and value reading come
//! from its field in `EngineConfig`; given flags become TOML keys laid over the
//! profile and `--config` file.

use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use sloserve_engine::knobs::{flags, Flag, KnobValue};

/// The engine flags given on the command line, as (flag, value).
#[derive(Debug, Clone, Default)]
pub struct EngineFlags {
    given: Vec<(&'static Flag, toml::Value)>,
}

impl EngineFlags {
    /// Sets a flag as `--NAME VALUE` would (for a switch, `value` is ignored).
    pub fn set(&mut self, flag: &str, value: &str) -> Result<(), String> {
        let f = flags()
            .iter()
            .find(|f| f.flag == flag)
            .ok_or_else(|| format!("no engine flag --{flag}"))?;
        let v = f.parse(Some(value)).map_err(|e| format!("--{flag}: {e}"))?;
        self.given.retain(|(g, _)| g.flag != f.flag);
        self.given.push((f, v));
        Ok(())
    }

    /// The given flags as TOML keys (later flags win).
    pub fn overrides(&self) -> toml::Table {
        let mut t = toml::Table::new();
        for (f, v) in &self.given {
            f.overrides(v, &mut t);
        }
        t
    }

    fn read(&mut self, m: &ArgMatches) {
        for f in flags() {
            let id = f.flag.as_str();
            let v = match f.value {
                KnobValue::Switch(b) => m.get_flag(id).then_some(toml::Value::Boolean(b)),
                KnobValue::Parse { .. } => m.get_one::<toml::Value>(id).cloned(),
            };
            if let Some(v) = v {
                self.given.retain(|(g, _)| g.flag != f.flag);
                self.given.push((f, v));
            }
        }
    }
}

fn arg(f: &'static Flag) -> Arg {
    let id = f.flag.as_str();
    // The first sentence as the short help, the whole doc for `--help`.
    let short = f
        .help
        .split(". ")
        .next()
        .unwrap_or(&f.help)
        .trim_end_matches('.');
    let a = Arg::new(id)
        .long(id)
        .help(short.to_string())
        .long_help(f.help.clone())
        .help_heading("Engine");
    match f.value {
        KnobValue::Switch(_) => a.action(ArgAction::SetTrue),
        KnobValue::Parse { parse, name } => a
            .value_name(name)
            .action(ArgAction::Set)
            .value_parser(move |s: &str| parse(s)),
    }
}

impl Args for EngineFlags {
    fn augment_args(cmd: Command) -> Command {
        flags().iter().fold(cmd, |c, f| c.arg(arg(f)))
    }
    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for EngineFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut s = EngineFlags::default();
        s.read(m);
        Ok(s)
    }
    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        self.read(m);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct P {
        #[command(flatten)]
        e: EngineFlags,
    }

    #[test]
    fn flags_parse_into_toml_keys() {
        let p = P::try_parse_from([
            "serve",
            "--max-num-seqs",
            "3",
            "--kv-cache-memory",
            "64MiB",
            "--no-prefix-cache",
            "--default-slo-class",
            "batch",
            "--batch-max-waiting-requests",
            "9",
        ])
        .unwrap();
        let t = p.e.overrides();
        assert_eq!(t["max_num_seqs"].as_integer(), Some(3));
        assert_eq!(t["kv_cache_memory"].as_integer(), Some(64 << 20));
        assert_eq!(t["enable_prefix_cache"].as_bool(), Some(false));
        assert_eq!(t["default_slo_class"].as_str(), Some("batch"));
        assert_eq!(
            t["admission"]["batch"]["max_waiting_requests"].as_integer(),
            Some(9)
        );
        for bad in [
            ["--max-num-seqs", "x"],
            ["--default-slo-class", "gold"],
            ["--slo-margin", "inf"],
        ] {
            let e = P::try_parse_from(["serve", bad[0], bad[1]])
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains(bad[0]) && e.contains(bad[1]), "{e}");
        }
        assert!(P::try_parse_from(["serve"])
            .unwrap()
            .e
            .overrides()
            .is_empty());
    }

    /// docs/serving.md's table of engine flags is the one the declarations give
    /// (`SLOSERVE_BLESS=1` rewrites it).
    #[test]
    fn the_docs_table_is_generated() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/serving.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let (begin, end) = ("<!-- engine-flags:begin -->\n", "<!-- engine-flags:end -->");
        let (i, j) = (
            doc.find(begin).expect("begin marker"),
            doc.find(end).expect("end marker"),
        );
        let want = sloserve_engine::knobs::markdown_table();
        let have = &doc[i + begin.len()..j];
        if have != want {
            if std::env::var_os("SLOSERVE_BLESS").is_some() {
                let new = format!("{}{begin}{want}{}", &doc[..i], &doc[j..]);
                std::fs::write(path, new).unwrap();
            } else {
                panic!("docs/serving.md's engine flags table is stale: run with SLOSERVE_BLESS=1");
            }
        }
    }
}
