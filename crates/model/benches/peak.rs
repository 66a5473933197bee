//! Roofline of this CPU for the default model (`cargo bench -p sloserve-model --bench
//! peak`): the f32 FMA rate of every core at once (the arithmetic of the packed GEMM
//! that decodes batches), the rate of an 8-bit block dot product (maddubs, madd,
//! convert, scale: the arithmetic of a Q4_1 x Q8_1 kernel) on data in L1, with
//! AVX-512 VNNI the rate of `vpdpbusd` (the 8-bit GEMM's inner instruction), and the
//! decode ceiling they imply: no kernel decodes faster than peak / FLOPs per token.
//! Beside them the memory ceiling: sustained read bandwidth of all cores from DRAM
//! (a buffer far larger than any cache) and from cache (a working set the size of
//! one layer of the model), and the batch-1 decode ceiling it implies: bytes read
//! per token (every weight matrix once in the file's format, the output matrix, and
//! the f16 KV cache at the forward bench's context) over the DRAM bandwidth.
//! Median of 5 runs; writes `target/bench/peak.json`.

use std::time::Instant;

use sloserve_model::{GgufFile, ModelConfig};

#[path = "common.rs"]
mod common;
use common::{median, model_path, target_dir};

const RUNS: usize = 5;
/// The forward bench's mean decode context (its steps run from 64 to 96).
const BENCH_CONTEXT: usize = 80;
/// The DRAM buffer: far larger than the last-level cache.
const DRAM_BYTES: usize = 1 << 30;

/// Bytes per second of `threads` threads each reading its share of `buf` `reps` times.
fn bandwidth(threads: usize, buf: &[u8], reps: usize) -> f64 {
    let chunk = buf.len() / threads;
    let t0 = Instant::now();
    let bytes: f64 = std::thread::scope(|s| {
        let hs: Vec<_> = buf
            .chunks(chunk)
            .take(threads)
            .map(|c| s.spawn(move || kernels::read(c, reps)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    bytes / t0.elapsed().as_secs_f64()
}

/// Bytes of a tensor in the file's format.
fn tensor_bytes(t: &candle_core::quantized::gguf_file::TensorInfo) -> usize {
    t.shape.elem_count() / t.ggml_dtype.block_size() * t.ggml_dtype.type_size()
}

/// Multiply-adds per second of `kernel` run on `threads` threads at once.
fn rate(threads: usize, kernel: fn() -> f64) -> f64 {
    let t0 = Instant::now();
    let macs: f64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads).map(|_| s.spawn(kernel)).collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    macs / t0.elapsed().as_secs_f64()
}

#[cfg(target_arch = "x86_64")]
mod kernels {
    use std::arch::x86_64::*;
    use std::hint::black_box;

    const ITERS: usize = 50_000_000;

    /// 12 independent FMA chains of 8 lanes; returns the multiply-adds done.
    pub fn fma_f32() -> f64 {
        // SAFETY: callers check AVX2 and FMA.
        unsafe { fma_inner() }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma_inner() -> f64 {
        let mut a = [_mm256_set1_ps(0.5); 12];
        let (b, c) = (_mm256_set1_ps(0.9999), _mm256_set1_ps(1e-4));
        for _ in 0..ITERS / 100 {
            for _ in 0..100 {
                for x in a.iter_mut() {
                    *x = _mm256_fmadd_ps(*x, b, c);
                }
            }
            a = black_box(a);
        }
        black_box(a);
        (ITERS * 12 * 8) as f64
    }

    /// Reads `buf` `reps` times (32-byte loads, four independent chains); returns
    /// the bytes read.
    pub fn read(buf: &[u8], reps: usize) -> f64 {
        // SAFETY: callers check AVX2.
        unsafe { read_inner(buf, reps) }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn read_inner(buf: &[u8], reps: usize) -> f64 {
        let mut acc = [_mm256_setzero_si256(); 4];
        let n = buf.len() / 128 * 128;
        for _ in 0..reps {
            let p = black_box(buf.as_ptr());
            let mut i = 0;
            while i < n {
                for (j, a) in acc.iter_mut().enumerate() {
                    // SAFETY: i + 32 * j + 32 <= n <= buf.len().
                    let v = unsafe { _mm256_loadu_si256(p.add(i + 32 * j) as *const __m256i) };
                    *a = _mm256_xor_si256(*a, v);
                }
                i += 128;
            }
        }
        black_box(acc);
        (n * reps) as f64
    }

    /// 12 independent AVX-512 VNNI `vpdpbusd` chains (64 u8 x i8 products summed into
    /// 16 i32 lanes each), the 8-bit GEMM's inner instruction; returns the
    /// multiply-adds done.
    pub fn vnni_dot() -> f64 {
        // SAFETY: callers check AVX-512 F, BW and VNNI.
        unsafe { vnni_inner() }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn vnni_inner() -> f64 {
        let mut a = [_mm512_setzero_si512(); 12];
        let (w, x) = (_mm512_set1_epi8(3), _mm512_set1_epi8(-2));
        for _ in 0..ITERS / 100 {
            for _ in 0..100 {
                for acc in a.iter_mut() {
                    *acc = _mm512_dpbusd_epi32(*acc, w, x);
                }
            }
            a = black_box(a);
        }
        black_box(a);
        (ITERS * 12 * 64) as f64
    }

    /// One 4-bit weight block (unpacked once) against 8 rows of 8-bit activations,
    /// 18 blocks per row (k = 576); returns the multiply-adds done.
    pub fn q4_block_dot() -> f64 {
        // SAFETY: callers check AVX2 and FMA.
        unsafe { q4_inner() }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn q4_inner() -> f64 {
        let x: Vec<i8> = (0..8 * 18 * 32).map(|i| (i % 7) as i8).collect();
        let w: Vec<u8> = (0..18 * 16).map(|i| (i * 13) as u8).collect();
        let scale = vec![1e-6f32; 8 * 18];
        let (ones, low) = (_mm256_set1_epi16(1), _mm_set1_epi8(15));
        let mut acc = [_mm256_setzero_ps(); 8];
        let iters = ITERS / 100;
        for _ in 0..iters {
            // Opaque pointers: the loads cannot be hoisted out of the loop.
            let (xp, wp) = (black_box(x.as_ptr()), black_box(w.as_ptr()));
            for b in 0..18 {
                let p = _mm_loadu_si128(wp.add(b * 16) as *const __m128i);
                let q = _mm256_set_m128i(
                    _mm_and_si128(_mm_srli_epi16(p, 4), low),
                    _mm_and_si128(p, low),
                );
                for (r, a) in acc.iter_mut().enumerate() {
                    let y = _mm256_loadu_si256(xp.add((r * 18 + b) * 32) as *const __m256i);
                    let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), ones);
                    let s = _mm256_broadcast_ss(&scale[r * 18 + b]);
                    *a = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(dot), *a);
                }
            }
            acc = black_box(acc);
        }
        black_box(acc);
        (iters * 18 * 8 * 32) as f64
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("peak: needs AVX2 and FMA");
            return;
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let file = GgufFile::open(model_path())
            .expect("open the model (make model, or SLOSERVE_BENCH_MODEL)");
        let c = ModelConfig::from_gguf(&file).expect("read its config");
        let macs = c.matmul_macs_per_token() as f64;
        eprintln!("peak: {threads} threads, {RUNS} runs of each kernel");
        let runs =
            |t: usize, k: fn() -> f64| median(&(0..RUNS).map(|_| rate(t, k)).collect::<Vec<_>>());
        let (f32_1, f32_n) = (runs(1, kernels::fma_f32), runs(threads, kernels::fma_f32));
        let (q4_1, q4_n) = (
            runs(1, kernels::q4_block_dot),
            runs(threads, kernels::q4_block_dot),
        );
        println!(
            "roofline: {threads} cores; model matmuls {:.1} M multiply-adds per token",
            macs / 1e6
        );
        println!(
            "{:<34} {:>12} {:>12} {:>20}",
            "kernel", "1 core", "all cores", "decode ceiling"
        );
        // The kernels' own check, so `SLOSERVE_ISA=avx2` drops the VNNI ceiling too.
        let vnni = sloserve_model::kernels::cpu::has_avx512_vnni();
        let mut rows = vec![
            ("f32 FMA (GFLOP/s)", f32_1, f32_n),
            ("q4 x q8 block dot (GMAC/s x 2)", q4_1, q4_n),
        ];
        let vnni_rates =
            vnni.then(|| (runs(1, kernels::vnni_dot), runs(threads, kernels::vnni_dot)));
        if let Some((v1, vn)) = vnni_rates {
            rows.push(("u8 x i8 VNNI dot (GMAC/s x 2)", v1, vn));
        }
        for (name, one, all) in rows {
            println!(
                "{name:<34} {:>12.1} {:>12.1} {:>14.0} tok/s",
                2.0 * one / 1e9,
                2.0 * all / 1e9,
                all / macs
            );
        }
        // Memory: DRAM, then a one-layer working set that stays in cache.
        let layer0: usize = file
            .content
            .tensor_infos
            .iter()
            .filter(|(n, _)| n.starts_with("blk.0."))
            .map(|(_, t)| tensor_bytes(t))
            .sum();
        let weights: usize = file
            .content
            .tensor_infos
            .iter()
            .filter(|(n, _)| n.starts_with("blk."))
            .map(|(_, t)| tensor_bytes(t))
            .sum();
        let output = file
            .tensor_info("output.weight")
            .or_else(|| file.tensor_info("token_embd.weight"))
            .map_or(0, tensor_bytes);
        let kv = c.kv_bytes_per_token(2) * BENCH_CONTEXT;
        let per_token = (weights + output + kv) as f64;
        let dram: Vec<u8> = (0..DRAM_BYTES).map(|i| i as u8).collect();
        let layer: Vec<u8> = (0..layer0.max(1 << 16)).map(|i| i as u8).collect();
        let layer_reps = (4 << 30) / layer.len();
        let (dram_1, dram_n) = (
            median(
                &(0..RUNS)
                    .map(|_| bandwidth(1, &dram, 2))
                    .collect::<Vec<_>>(),
            ),
            median(
                &(0..RUNS)
                    .map(|_| bandwidth(threads, &dram, 2))
                    .collect::<Vec<_>>(),
            ),
        );
        let (cache_1, cache_n) = (
            median(
                &(0..RUNS)
                    .map(|_| bandwidth(1, &layer, layer_reps))
                    .collect::<Vec<_>>(),
            ),
            median(
                &(0..RUNS)
                    .map(|_| bandwidth(threads, &layer, layer_reps))
                    .collect::<Vec<_>>(),
            ),
        );
        println!(
            "{:<34} {:>12} {:>12} {:>20}",
            "read bandwidth (GB/s)", "1 core", "all cores", "batch-1 ceiling"
        );
        for (name, one, all) in [
            ("DRAM (1 GiB buffer)", dram_1, dram_n),
            ("cache (one layer's bytes)", cache_1, cache_n),
        ] {
            println!(
                "{name:<34} {:>12.1} {:>12.1} {:>14.0} tok/s",
                one / 1e9,
                all / 1e9,
                all / per_token
            );
        }
        println!(
            "bytes per batch-1 token: {:.1} MB (weights {:.1} MB, output matrix {:.1} MB, f16 KV at context {BENCH_CONTEXT} {:.2} MB; one layer {:.2} MB); load {}",
            per_token / 1e6,
            weights as f64 / 1e6,
            output as f64 / 1e6,
            kv as f64 / 1e6,
            layer0 as f64 / 1e6,
            common::load_avg()
        );
        let json = serde_json::json!({
            "bench": "peak",
            "threads": threads,
            "matmul_macs_per_token": macs,
            "f32_fma_gflops": {"one": 2.0 * f32_1 / 1e9, "all": 2.0 * f32_n / 1e9},
            "q4_block_dot_gflops": {"one": 2.0 * q4_1 / 1e9, "all": 2.0 * q4_n / 1e9},
            "vnni_dot_gflops": vnni_rates.map(|(one, all)| serde_json::json!({"one": 2.0 * one / 1e9, "all": 2.0 * all / 1e9})),
            "decode_ceiling_tok_s": {"f32": f32_n / macs, "q4": q4_n / macs},
            "read_bandwidth_gb_s": {
                "dram": {"one": dram_1 / 1e9, "all": dram_n / 1e9},
                "one_layer_in_cache": {"one": cache_1 / 1e9, "all": cache_n / 1e9, "bytes": layer0},
            },
            "batch1_bytes_per_token": per_token,
            "batch1_decode_ceiling_tok_s": {"dram": dram_n / per_token, "cache": cache_n / per_token},
            "load": common::load_avg(),
        });
        let dir = target_dir().join("bench");
        std::fs::create_dir_all(&dir).expect("create target/bench");
        let out = dir.join("peak.json");
        std::fs::write(&out, serde_json::to_string_pretty(&json).unwrap()).expect("write json");
        println!("wrote {}", out.display());
    }
}
