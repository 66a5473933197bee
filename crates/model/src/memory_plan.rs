//! The load-time memory plan: the bytes the weights will be held in, the KV cache
//! budget (asked for, or the default this machine's free memory leaves), and the
//! refusal at start when the weights and the KV cache do not fit.
//!
//! The default budget (`--kv-cache-memory` unset): half of what the machine has
//! available at start (`MemAvailable`) once the weights and a 300 MB margin are
//! taken, at most 8 GiB, at least 64 MiB (less is a refusal). Half, because the
//! other half is the page cache and whatever else shares the machine (a second
//! replica, the tokenizer's and the batch store's growth); 8 GiB, because on a CPU
//! that already holds every running sequence at full length (Qwen2.5 1.5B: about
//! 300,000 tokens, 64 sequences of 4,096 take 7.5 GB) and more only keeps colder
//! prefixes. The pool is allocated zeroed and untouched, so it becomes resident
//! only as sequences fill it.

use candle_core::quantized::GgmlDType;

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::weights::Precision;

/// What the process needs beside the weights and the KV cache: activations,
/// tokenizer, grammar vocabulary, the server.
pub const MARGIN_BYTES: u64 = 300_000_000;
/// The default budget's ceiling.
pub const DEFAULT_KV_MAX: u64 = 8 << 30;
/// The default budget's floor: below it the model is refused rather than served
/// with a pool that holds a few short sequences.
pub const DEFAULT_KV_MIN: u64 = 64 << 20;
/// The default where the machine's available memory cannot be read.
pub const DEFAULT_KV_UNKNOWN: u64 = 2 << 30;

/// Where the KV budget came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvSource {
    /// `--kv-cache-memory`.
    Asked,
    /// The default rule, from `MemAvailable`.
    FromAvailable,
    /// The default rule with no `MemAvailable` to read.
    Unknown,
}

/// The plan a runner loads by.
#[derive(Clone, Copy, Debug)]
pub struct MemoryPlan {
    /// Estimated bytes the weights are held in, in this precision.
    pub weights: u64,
    /// The KV cache budget.
    pub kv: u64,
    pub kv_source: KvSource,
    /// `MemAvailable` at start.
    pub available: Option<u64>,
}

impl MemoryPlan {
    /// Plans the load of `file` in `precision` with `kv_asked` bytes of KV cache
    /// (`None`: the default rule), or refuses it.
    pub fn new(file: &GgufFile, precision: Precision, kv_asked: Option<usize>) -> Result<Self> {
        // MXFP4 tensors are held as Q8_0 (`crate::mxfp4`).
        let weights = file
            .tensor_sizes()
            .map(|(_, n, dtype, _)| n as f64 * held_bytes_per_weight(dtype, precision))
            .sum::<f64>() as u64;
        let available = mem_available();
        Self::decide(weights, kv_asked.map(|b| b as u64), available, |fit_mb| {
            ModelError::DoesNotFit {
                path: file.path.clone(),
                precision: format!("{precision:?} precision").to_lowercase(),
                weights_mb: weights / 1_000_000,
                kv: match kv_asked {
                    Some(b) => format!("asked for {} MB", b / 1_000_000),
                    None => format!(
                        "needs at least {} MB (the default: half of what the weights leave)",
                        DEFAULT_KV_MIN / 1_000_000
                    ),
                },
                available_mb: available.unwrap_or(0) / 1_000_000,
                fit_mb,
            }
        })
    }

    /// The rule, apart from the file and the machine (tested below).
    fn decide(
        weights: u64,
        kv_asked: Option<u64>,
        available: Option<u64>,
        refuse: impl FnOnce(u64) -> ModelError,
    ) -> Result<Self> {
        let plan = |kv, kv_source| MemoryPlan {
            weights,
            kv,
            kv_source,
            available,
        };
        let Some(available) = available else {
            return Ok(match kv_asked {
                Some(kv) => plan(kv, KvSource::Asked),
                None => plan(DEFAULT_KV_UNKNOWN, KvSource::Unknown),
            });
        };
        // What the KV cache may take: what is left once the weights and the margin are.
        let left = available.saturating_sub(weights + MARGIN_BYTES);
        match kv_asked {
            Some(kv) if kv <= left => Ok(plan(kv, KvSource::Asked)),
            Some(_) => Err(refuse(left / 1_000_000)),
            None if left / 2 >= DEFAULT_KV_MIN => Ok(plan(
                (left / 2).min(DEFAULT_KV_MAX),
                KvSource::FromAvailable,
            )),
            None => Err(refuse(left / 1_000_000)),
        }
    }
}

/// Bytes a tensor of `dtype` is held in, per weight, by precision (`linear.rs`'s
/// forms: panels one byte a value, nibbles for types of at most 4 bits (Q2_K and
/// Q3_K included), with AVX-512 VNNI nibbles and high planes (0.75 bytes) for 5- and
/// 6-bit types; exact precision the file's blocks, tiles dequantized inside the
/// GEMM, or f32 without AVX2). An estimate for the load-time memory check.
pub fn held_bytes_per_weight(dtype: GgmlDType, precision: Precision) -> f64 {
    use GgmlDType as D;
    if precision == Precision::Exact {
        return match crate::kernels::cpu::has_avx2() {
            true => dtype.type_size() as f64 / dtype.block_size() as f64,
            false => 4.0,
        };
    }
    // 5- and 6-bit values: a quarter of a byte less each as high planes.
    use crate::kernels::int8_gemm::Isa;
    use crate::kernels::int8_panels::Packing;
    let planes = match Isa::best().map(Isa::packing) {
        Some(Packing::Planes) => 0.25,
        _ => 0.0,
    };
    match dtype {
        D::F32 => 4.0,
        D::F16 | D::BF16 => 6.0,
        D::Q4_0 => 0.5625,
        D::Q4_1 => 0.625,
        D::Q4K | D::Q3K => 0.58,
        D::Q5_0 => 1.0625 - planes,
        D::Q5_1 => 1.125 - planes,
        D::Q5K | D::Q6K => 1.08 - planes,
        D::Q8_0 => 1.1875,
        D::Q2K => 0.64,
        _ => 4.0,
    }
}

/// MemAvailable from /proc/meminfo, in bytes (`None` where there is none).
pub fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;
    const GIB: u64 = 1 << 30;

    fn decide(weights: u64, asked: Option<u64>, available: Option<u64>) -> Result<MemoryPlan> {
        MemoryPlan::decide(weights, asked, available, |fit| {
            ModelError::Runtime(format!("refused, {fit} MB would fit"))
        })
    }

    #[test]
    fn the_default_is_half_of_what_the_weights_leave() {
        // 24 GB available, 1.5 GB of weights: (24 - 1.5 - 0.3) / 2 = 11.1 GB -> the cap.
        let p = decide(1_500_000_000, None, Some(24 * GB)).unwrap();
        assert_eq!(
            (p.kv, p.kv_source),
            (DEFAULT_KV_MAX, KvSource::FromAvailable)
        );
        // 6 GB available: (6 - 1.5 - 0.3) / 2 = 2.1 GB.
        let p = decide(1_500_000_000, None, Some(6 * GB)).unwrap();
        assert_eq!(p.kv, 2_100_000_000);
        // What is left beside the weights never goes to the KV cache whole.
        for avail in [2 * GB, 3 * GB, 10 * GB, 40 * GB] {
            let p = decide(GB, None, Some(avail)).unwrap();
            assert!(p.kv <= (avail - GB - MARGIN_BYTES) / 2, "{avail}: {p:?}");
            assert!(p.kv >= DEFAULT_KV_MIN.min(DEFAULT_KV_MAX));
        }
    }

    #[test]
    fn weights_that_leave_too_little_are_refused() {
        // 1.5 GB available, 1.1 GB of weights: 100 MB left, 50 MB of KV < 64 MiB.
        let e = decide(1_100_000_000, None, Some(1_500_000_000)).unwrap_err();
        assert!(e.to_string().contains("100 MB would fit"), "{e}");
        // Weights larger than the machine: nothing fits, no underflow.
        assert!(decide(30 * GB, None, Some(24 * GB)).is_err());
    }

    #[test]
    fn an_asked_budget_is_kept_or_refused() {
        let p = decide(GB, Some(4 * GIB), Some(24 * GB)).unwrap();
        assert_eq!((p.kv, p.kv_source), (4 * GIB, KvSource::Asked));
        // Past the cap is allowed when asked for.
        let p = decide(GB, Some(12 * GIB), Some(24 * GB)).unwrap();
        assert_eq!(p.kv, 12 * GIB);
        let e = decide(GB, Some(30 * GIB), Some(24 * GB)).unwrap_err();
        assert!(e.to_string().contains("22700 MB would fit"), "{e}");
    }

    #[test]
    fn without_meminfo_the_asked_or_a_fixed_budget() {
        let p = decide(GB, None, None).unwrap();
        assert_eq!((p.kv, p.kv_source), (DEFAULT_KV_UNKNOWN, KvSource::Unknown));
        assert_eq!(decide(GB, Some(GIB), None).unwrap().kv, GIB);
    }

    #[test]
    fn exact_precision_counts_the_files_bytes() {
        let exact = |d| held_bytes_per_weight(d, Precision::Exact);
        if crate::kernels::cpu::has_avx2() {
            assert_eq!(exact(GgmlDType::Q4K), 144.0 / 256.0);
            assert_eq!(exact(GgmlDType::Q6K), 210.0 / 256.0);
            assert_eq!(exact(GgmlDType::Q8_0), 34.0 / 32.0);
            assert_eq!(exact(GgmlDType::F16), 2.0);
        } else {
            assert_eq!(exact(GgmlDType::Q4K), 4.0);
        }
        assert_eq!(exact(GgmlDType::F32), 4.0);
        assert!(held_bytes_per_weight(GgmlDType::Q4K, Precision::Fast) < 1.0);
    }
}
