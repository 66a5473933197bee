//! `RouteArgs` (the flags of `sloserve route`) and `RouterConfig`: fleets of replica
//! URLs, the objective table, picking, spill-over and health settings, from a TOML
//! file laid under the flags.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serde::Deserialize;
use sloserve_slo::SloClass;

use crate::guard::{GuardArgs, GuardConfig};

/// A replica's default `--max-body-bytes`: the router refuses larger bodies itself.
pub const DEFAULT_MAX_BODY: usize = 4 << 20;

/// How a replica is chosen within a fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Prefix affinity (consistent hashing with bounded load) over least outstanding work.
    Affinity,
    /// Least outstanding work (in-flight prompt + max tokens) alone.
    LeastWork,
    /// Replicas in turn (a baseline for benchmarks).
    RoundRobin,
}

#[derive(Args, Debug, Clone, Default)]
pub struct RouteArgs {
    /// A fleet: NAME=URL,URL (repeatable). A request of class C goes to the fleet named C.
    #[arg(long = "fleet", value_name = "NAME=URL,URL")]
    pub fleets: Vec<String>,
    /// TOML file: `[fleets]`, `[objectives]` and any setting below (flags win).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Gateway objective -> class: NAME=interactive|batch (repeatable).
    #[arg(long = "objective", value_name = "NAME=CLASS")]
    pub objectives: Vec<String>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 9000)]
    pub port: u16,
    /// affinity (default), least-work or round-robin.
    #[arg(long)]
    pub policy: Option<Policy>,
    /// Class of requests that name none (default interactive).
    #[arg(long)]
    pub default_class: Option<SloClass>,
    /// Let batch requests use idle interactive replicas (sent there in the batch class).
    #[arg(long)]
    pub spill_over: bool,
    /// Most spilled batch requests on one interactive replica at once (default 4).
    #[arg(long)]
    pub spill_max_inflight: Option<usize>,
    /// Milliseconds between active `/health` + `/ready` checks (default 1000).
    #[arg(long)]
    pub health_interval_ms: Option<u64>,
    /// Consecutive failed requests (connection error or 5xx) that eject a replica (default 1).
    #[arg(long)]
    pub eject_after: Option<u32>,
    /// Characters of the prompt hashed for prefix affinity (default 256).
    #[arg(long)]
    pub prefix_chars: Option<usize>,
    /// A replica takes a prefix's request while its load is at most this times the mean (default 1.25).
    #[arg(long)]
    pub load_factor: Option<f64>,
    /// Largest request body in bytes (413 beyond, no replica asked); default 4 MiB, a
    /// replica's default. Set it to the smallest replica's `--max-body-bytes`.
    #[arg(long)]
    pub max_body_bytes: Option<usize>,
    /// API keys, the connection cap and the timeouts.
    #[command(flatten)]
    pub guard: GuardArgs,
}

/// The `--config` TOML file; every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    fleets: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    objectives: BTreeMap<String, SloClass>,
    policy: Option<Policy>,
    default_class: Option<SloClass>,
    spill_over: Option<bool>,
    spill_max_inflight: Option<usize>,
    health_interval_ms: Option<u64>,
    eject_after: Option<u32>,
    prefix_chars: Option<usize>,
    load_factor: Option<f64>,
    max_body_bytes: Option<usize>,
    /// `[guard]`: keys (a file only), connection cap, timeouts.
    guard: Option<GuardArgs>,
}

/// One fleet: its name and its replicas' base URLs (no trailing `/`).
#[derive(Debug, Clone, PartialEq)]
pub struct FleetConfig {
    pub name: String,
    pub urls: Vec<String>,
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub fleets: Vec<FleetConfig>,
    pub objectives: BTreeMap<String, SloClass>,
    pub default_class: SloClass,
    pub policy: Policy,
    pub spill_over: bool,
    pub spill_max_inflight: usize,
    pub health_interval: Duration,
    pub eject_after: u32,
    pub prefix_chars: usize,
    /// Prompts are hashed in whole chunks of this many characters.
    pub prefix_align: usize,
    pub load_factor: f64,
    pub max_body_bytes: usize,
    pub guard: GuardConfig,
}

impl RouterConfig {
    /// Defaults with these fleets (tests build configs this way).
    pub fn with_fleets(fleets: &[(&str, &[String])]) -> anyhow::Result<Self> {
        let mut c = Self::defaults();
        for (name, urls) in fleets {
            c.add_fleet(name, urls.iter().map(String::as_str))?;
        }
        c.check()?;
        Ok(c)
    }

    fn defaults() -> Self {
        RouterConfig {
            fleets: Vec::new(),
            objectives: BTreeMap::new(),
            default_class: SloClass::Interactive,
            policy: Policy::Affinity,
            spill_over: false,
            spill_max_inflight: 4,
            health_interval: Duration::from_millis(1000),
            eject_after: 1,
            prefix_chars: 256,
            prefix_align: 64,
            load_factor: 1.25,
            max_body_bytes: DEFAULT_MAX_BODY,
            guard: GuardConfig::default(),
        }
    }

    /// The file (if any), then the flags.
    pub fn from_args(args: &RouteArgs) -> anyhow::Result<Self> {
        let mut c = Self::defaults();
        if let Some(path) = &args.config {
            c.apply_file(path)?;
        }
        for f in &args.fleets {
            let (name, urls) = f
                .split_once('=')
                .with_context(|| format!("--fleet {f:?}: expected NAME=URL,URL"))?;
            c.fleets.retain(|x| x.name != name.trim());
            c.add_fleet(name.trim(), urls.split(','))
                .with_context(|| format!("--fleet {f:?}"))?;
        }
        for o in &args.objectives {
            let (name, class) = o
                .split_once('=')
                .with_context(|| format!("--objective {o:?}: expected NAME=CLASS"))?;
            let class = class
                .parse::<SloClass>()
                .map_err(|e| anyhow::anyhow!("--objective {o:?}: {e}"))?;
            c.objectives.insert(name.trim().to_owned(), class);
        }
        set(&mut c.policy, args.policy);
        set(&mut c.default_class, args.default_class);
        c.spill_over |= args.spill_over;
        set(&mut c.spill_max_inflight, args.spill_max_inflight);
        set(
            &mut c.health_interval,
            args.health_interval_ms.map(Duration::from_millis),
        );
        set(&mut c.eject_after, args.eject_after);
        set(&mut c.prefix_chars, args.prefix_chars);
        set(&mut c.load_factor, args.load_factor);
        set(&mut c.max_body_bytes, args.max_body_bytes);
        c.guard.apply(&args.guard)?;
        c.check()?;
        Ok(c)
    }

    fn apply_file(&mut self, path: &Path) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let f: FileConfig =
            toml::from_str(&text).with_context(|| format!("{}: invalid", path.display()))?;
        for (name, urls) in &f.fleets {
            self.add_fleet(name, urls.iter().map(String::as_str))
                .with_context(|| format!("{}: fleet {name:?}", path.display()))?;
        }
        self.objectives.extend(f.objectives);
        set(&mut self.policy, f.policy);
        set(&mut self.default_class, f.default_class);
        set(&mut self.spill_over, f.spill_over);
        set(&mut self.spill_max_inflight, f.spill_max_inflight);
        set(
            &mut self.health_interval,
            f.health_interval_ms.map(Duration::from_millis),
        );
        set(&mut self.eject_after, f.eject_after);
        set(&mut self.prefix_chars, f.prefix_chars);
        set(&mut self.load_factor, f.load_factor);
        set(&mut self.max_body_bytes, f.max_body_bytes);
        if let Some(g) = &f.guard {
            self.guard
                .apply(g)
                .with_context(|| format!("{}: [guard]", path.display()))?;
        }
        self.check()
            .with_context(|| format!("{}: invalid", path.display()))
    }

    fn add_fleet<'a>(
        &mut self,
        name: &str,
        urls: impl Iterator<Item = &'a str>,
    ) -> anyhow::Result<()> {
        if name.is_empty() {
            bail!("a fleet needs a name");
        }
        let urls = urls
            .map(normalize_url)
            .collect::<anyhow::Result<Vec<_>>>()?;
        if urls.is_empty() {
            bail!("fleet {name:?} has no replica URLs");
        }
        self.fleets.push(FleetConfig {
            name: name.to_owned(),
            urls,
        });
        Ok(())
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.health_interval.is_zero() {
            bail!("health_interval_ms must be positive");
        }
        if !(self.load_factor >= 1.0 && self.load_factor.is_finite()) {
            bail!("load_factor must be at least 1 (got {})", self.load_factor);
        }
        if self.max_body_bytes == 0 {
            bail!("max_body_bytes must be positive");
        }
        if self.eject_after == 0 {
            bail!("eject_after must be at least 1");
        }
        Ok(())
    }

    /// Checks that there is something to route to (the file may add fleets later).
    pub fn require_fleets(&self) -> anyhow::Result<()> {
        if self.fleets.is_empty() {
            bail!("no fleets: give --fleet NAME=URL,URL or a --config file with [fleets]");
        }
        Ok(())
    }
}

fn set<T>(slot: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *slot = v;
    }
}

/// `http://host:port[/prefix]` without a trailing `/` or `/v1`.
pub fn normalize_url(url: &str) -> anyhow::Result<String> {
    let u = url.trim().trim_end_matches('/');
    let u = u.strip_suffix("/v1").unwrap_or(u);
    let rest = u
        .strip_prefix("http://")
        .with_context(|| format!("replica URL {url:?}: only http:// URLs are supported"))?;
    if rest.is_empty() || rest.starts_with('/') {
        bail!("replica URL {url:?} has no host");
    }
    u.parse::<hyper::Uri>()
        .with_context(|| format!("replica URL {url:?} is not a valid URI"))?;
    Ok(u.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_lay_over_the_file() {
        let dir = std::env::temp_dir().join(format!("route-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.toml");
        std::fs::write(
            &path,
            "policy = \"round-robin\"\nspill_over = true\n[fleets]\ninteractive = [\"http://a:1/\"]\nbatch = [\"http://b:2/v1\"]\n[objectives]\noffline = \"batch\"\n",
        )
        .unwrap();
        let args = RouteArgs {
            config: Some(path.clone()),
            fleets: vec!["interactive=http://c:3,http://d:4".into()],
            objectives: vec!["chat=interactive".into()],
            policy: Some(Policy::Affinity),
            ..Default::default()
        };
        let c = RouterConfig::from_args(&args).unwrap();
        assert_eq!(c.policy, Policy::Affinity);
        assert!(c.spill_over);
        let names: Vec<_> = c.fleets.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["batch", "interactive"]);
        assert_eq!(c.fleets[0].urls, ["http://b:2"]);
        assert_eq!(c.fleets[1].urls, ["http://c:3", "http://d:4"]);
        assert_eq!(c.objectives["offline"], SloClass::Batch);
        assert_eq!(c.objectives["chat"], SloClass::Interactive);

        assert_eq!(c.max_body_bytes, DEFAULT_MAX_BODY);
        std::fs::write(
            &path,
            "[fleets]\ni = [\"http://a:1\"]\n[guard]\nupstream_timeout = 5\nmax_connections = 9\n",
        )
        .unwrap();
        let c = RouterConfig::from_args(&args).unwrap();
        assert_eq!(c.guard.upstream_timeout, Some(Duration::from_secs(5)));
        assert_eq!(c.guard.max_connections, 9);
        std::fs::write(&path, "[guard]\napi_keys = [\"k\"]\n").unwrap();
        let e = format!("{:#}", RouterConfig::from_args(&args).unwrap_err());
        assert!(e.contains("unknown field"), "keys only from a file: {e}");
        std::fs::write(&path, "[fleets]\nx = [\"ftp://a\"]\n").unwrap();
        let e = format!("{:#}", RouterConfig::from_args(&args).unwrap_err());
        assert!(e.contains("r.toml") && e.contains("http://"), "{e}");
        std::fs::write(&path, "fleet = 1\n").unwrap();
        let e = format!("{:#}", RouterConfig::from_args(&args).unwrap_err());
        assert!(e.contains("r.toml") && e.contains("unknown field"), "{e}");
        let bad = RouteArgs {
            fleets: vec!["nourls".into()],
            ..Default::default()
        };
        assert!(format!("{:#}", RouterConfig::from_args(&bad).unwrap_err()).contains("NAME=URL"));
    }
}
