//! What the hand-written kernels share: the CPU feature check (done once, capped by
//! `SLOSERVE_ISA`), the raw output pointer that parallel tasks write disjoint parts
//! through, the lane sum of an AVX register, and (in tests) deterministic test data.

/// Whether the CPU has AVX2, FMA and F16C, which every hand-written kernel needs.
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static AVX2: OnceLock<bool> = OnceLock::new();
        *AVX2.get_or_init(|| {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The environment variable that caps the instruction sets the kernels use.
pub const ISA_ENV: &str = "SLOSERVE_ISA";

/// The most the kernels may use: `SLOSERVE_ISA=avx2` keeps them off AVX-512 (to
/// measure or serve the AVX2 route on a CPU that has both); unset or `best`, all the
/// CPU has. Any other value is an error the binary reports at start.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum IsaCap {
    Best,
    Avx2,
}

impl IsaCap {
    /// The cap `SLOSERVE_ISA` names (read once per process); `avx2` among the items of
    /// `SLOSERVE_DENSE`, its older spelling (which capped only the 8-bit GEMM), caps too.
    pub fn from_env() -> Result<IsaCap, String> {
        use std::sync::OnceLock;
        static CAP: OnceLock<Result<IsaCap, String>> = OnceLock::new();
        CAP.get_or_init(|| {
            let dense = std::env::var("SLOSERVE_DENSE").unwrap_or_default();
            match dense.split(',').any(|c| c == "avx2") {
                true => Ok(IsaCap::Avx2),
                false => IsaCap::parse(std::env::var(ISA_ENV).ok().as_deref()),
            }
        })
        .clone()
    }

    fn parse(v: Option<&str>) -> Result<IsaCap, String> {
        match v.map(str::trim) {
            None | Some("") | Some("best") => Ok(IsaCap::Best),
            Some("avx2") => Ok(IsaCap::Avx2),
            Some(other) => Err(format!(
                "{ISA_ENV}={other:?}: expected `avx2` (no AVX-512) or `best` (all the CPU has)"
            )),
        }
    }
}

/// The instruction sets the kernels use here, in words (for the load log).
pub fn kernels_in_use() -> &'static str {
    match (has_avx512_bf16(), has_avx512_vnni(), has_avx2()) {
        (true, ..) => "AVX-512 VNNI + BF16",
        (false, true, _) => "AVX-512 VNNI",
        (.., true) => "AVX2",
        _ => "portable (no AVX2)",
    }
}

/// Whether the CPU also has AVX-512 (F, BW) with VNNI's 8-bit dot products, and
/// `SLOSERVE_ISA` allows it.
pub fn has_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static VNNI: OnceLock<bool> = OnceLock::new();
        *VNNI.get_or_init(|| {
            has_avx2()
                && IsaCap::from_env() != Ok(IsaCap::Avx2)
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU also has AVX-512 BF16's pair products (`vdpbf16ps`).
pub fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static BF16: OnceLock<bool> = OnceLock::new();
        *BF16.get_or_init(|| has_avx512_vnni() && is_x86_feature_detected!("avx512bf16"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Raw output pointer that may cross threads: every task writes disjoint elements.
#[derive(Clone, Copy)]
pub struct OutPtr(pub *mut f32);
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    pub fn get(self) -> *mut f32 {
        self.0
    }
}

/// Sum of the eight lanes of `v`.
///
/// # Safety
/// The CPU must have AVX (implied by `has_avx2()`).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
pub unsafe fn hsum256(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// The environment variable a kernel test reads for the instruction set it must
/// run (`avx2` or `avx512-bf16`): where the CPU lacks it the test fails instead of
/// skipping, so a CI job meant to cover a route cannot pass without running it.
pub const TEST_ISA_ENV: &str = "SLOSERVE_TEST_ISA";

/// Panics when `SLOSERVE_TEST_ISA` names an instruction set this CPU (or the
/// `SLOSERVE_ISA` cap) does not give the kernels, or an unknown one.
pub fn require_test_isa() {
    let Ok(want) = std::env::var(TEST_ISA_ENV) else {
        return;
    };
    let have = match want.trim() {
        "" => true,
        "avx2" => has_avx2(),
        "avx512-bf16" => has_avx512_bf16(),
        other => panic!("{TEST_ISA_ENV}={other:?}: expected `avx2` or `avx512-bf16`"),
    };
    assert!(
        have,
        "{TEST_ISA_ENV}={want}: this CPU lacks it ({} here), so its kernels cannot be tested",
        kernels_in_use()
    );
}

/// Deterministic values in [-1, 1) for kernel tests and benches.
pub fn test_data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::IsaCap;

    #[test]
    fn isa_cap_reads_its_values_and_names_a_bad_one() {
        assert_eq!(IsaCap::parse(None), Ok(IsaCap::Best));
        assert_eq!(IsaCap::parse(Some("best")), Ok(IsaCap::Best));
        assert_eq!(IsaCap::parse(Some(" avx2")), Ok(IsaCap::Avx2));
        let e = IsaCap::parse(Some("avx512")).unwrap_err();
        assert!(
            e.contains("SLOSERVE_ISA=\"avx512\"") && e.contains("avx2"),
            "{e}"
        );
    }
}
