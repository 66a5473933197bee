//! Which instruction sets the kernel tests exercised: each kernel test says, per
//! route, whether it ran it or skipped it (the CPU lacks the ISA), and with
//! `SLOSERVE_ISA_LEDGER=DIR` set appends that to a file there, so that
//! `scripts/isa_report.py` can print the ISAs a run covered and fail it when a
//! route the machine has was skipped or never reported (`make test` does both).

use std::io::Write;

use super::cpu::{has_avx2, has_avx512_bf16, has_avx512_vnni};

/// The environment variable naming the ledger's directory.
pub const LEDGER_ENV: &str = "SLOSERVE_ISA_LEDGER";

/// A kernel route's instruction set, as the ledger and the report name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestIsa {
    Avx2,
    Avx512Vnni,
    Avx512Bf16,
}

impl TestIsa {
    /// The ledger's name for it.
    pub fn name(self) -> &'static str {
        match self {
            TestIsa::Avx2 => "avx2",
            TestIsa::Avx512Vnni => "avx512-vnni",
            TestIsa::Avx512Bf16 => "avx512-bf16",
        }
    }

    /// Whether the kernels may use it here (the CPU has it and `SLOSERVE_ISA` allows it).
    pub fn available(self) -> bool {
        match self {
            TestIsa::Avx2 => has_avx2(),
            TestIsa::Avx512Vnni => has_avx512_vnni(),
            TestIsa::Avx512Bf16 => has_avx512_bf16(),
        }
    }
}

/// Records that the test of `kernel` ran its `isa` route (`true`) or skipped it
/// because the kernels cannot use it here (`false`, also printed); returns
/// whether it is available, so a test reads `if !route("k", isa) { return; }`.
pub fn route(kernel: &str, isa: TestIsa) -> bool {
    let ran = isa.available();
    if !ran {
        eprintln!("skipped {kernel} on {}: not on this CPU", isa.name());
    }
    record(kernel, isa, ran);
    ran
}

/// Appends one `kernel \t isa \t ran|skipped` line to this process's ledger file,
/// when `SLOSERVE_ISA_LEDGER` names a directory. A ledger that cannot be written
/// fails the test: a run that asked for a report must not lose its entries.
fn record(kernel: &str, isa: TestIsa, ran: bool) {
    let Some(dir) = std::env::var_os(LEDGER_ENV) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let path = dir.join(format!("ledger-{}.tsv", std::process::id()));
    let line = format!(
        "{kernel}\t{}\t{}\n",
        isa.name(),
        if ran { "ran" } else { "skipped" }
    );
    let written = std::fs::create_dir_all(&dir).and_then(|_| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?
            .write_all(line.as_bytes())
    });
    if let Err(e) = written {
        panic!("{LEDGER_ENV}: cannot append to {}: {e}", path.display());
    }
}
