//! `QuantActs`: activation rows quantized to 8 bits in blocks of 32 for the 8-bit
//! GEMM (`int8_gemm`), vectorized with AVX2 but bit for bit what candle's
//! `BlockQ8_0::from_float` computes (scale `amax / 127` rounded to f16, values
//! `round(x / scale)` half away from zero, so within ±127), and each block's exact
//! value sum. The values of each block lie in one aligned 32-byte vector. Blocks are
//! stored block-major (`at(row, b)`): a GEMM tile reads block `b` of consecutive rows
//! at one base address and constant offsets.

use std::ops::Range;

use half::f16;

use crate::kernels::lines::{Lines, Plain};
use crate::kernels::pool::parallel_for;

/// One block's 8-bit values.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub struct Block(pub [i8; 32]);
// SAFETY: bytes, any bit pattern a value.
unsafe impl Plain for Block {}

/// One block's values shifted to `0..=255` (`q + 128`) and split into nibbles: the
/// low 4 bits, then the high 4, one byte each (`QuantActs::split`).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Halves {
    pub lo: [u8; 32],
    pub hi: [u8; 32],
}
// SAFETY: bytes, any bit pattern a value.
unsafe impl Plain for Halves {}

/// `rows` activation rows of `kb` blocks each, block-major: every vector below is
/// indexed by `at(row, b)`.
#[derive(Default)]
pub struct QuantActs {
    pub kb: usize,
    /// Rows of the last `quantize`.
    pub rows: usize,
    pub qs: Lines<Block>,
    /// Block scales (f16 values, as f32).
    pub d: Lines<f32>,
    /// Each block's exact sum of its 8-bit values.
    pub sum: Lines<i32>,
    /// The sum of each block's first 16 values (what a Q6_K half's zero point
    /// multiplies).
    pub sum_lo: Lines<i32>,
    /// `d · sum` (f32 product): what a block's minimum multiplies.
    pub dsum: Lines<f32>,
    /// Blocks of the last `quantize`.
    blocks: usize,
    /// The values as `Halves`, after `split` (the AVX2 GEMM's 8-bit weights).
    pub halves: Lines<Halves>,
    /// After `fold_zero(z)`: `-z · Σ q_a` over each block's first 16 values, its
    /// last 16 and all 32: where a GEMM tile starts a panel's integer sums, so that
    /// the panel's zero point comes off exactly with no work per block in the tile.
    pub zero_lo: Lines<i32>,
    pub zero_hi: Lines<i32>,
    pub zero_all: Lines<i32>,
}

/// Rows a task of `QuantActs::quantize` takes: 16 f32 scales fill a 64-byte line.
const ROWS_PER_TASK: usize = 16;

/// Quantizes of at least this many rows (a prompt chunk's) are written with
/// non-temporal stores.
const STREAM_ROWS: usize = 64;

impl QuantActs {
    /// Quantizes `x` (`[rows, k]`, k a multiple of 32). Many blocks (a prefill's) are
    /// split over the pool.
    pub fn quantize(&mut self, x: &[f32], k: usize) {
        let kb = k / 32;
        let blocks = x.len() / 32;
        let rows = blocks / kb.max(1);
        self.kb = kb;
        self.rows = rows;
        self.blocks = blocks;
        self.qs.grow(blocks);
        self.d.grow(blocks);
        self.sum.grow(blocks);
        self.sum_lo.grow(blocks);
        self.dsum.grow(blocks);
        let out = BlockOut {
            qs: self.qs.as_mut_ptr(),
            d: self.d.as_mut_ptr(),
            sum: self.sum.as_mut_ptr(),
            sum_lo: self.sum_lo.as_mut_ptr(),
            dsum: self.dsum.as_mut_ptr(),
        };
        // A prompt chunk's values go past the caches: the lines they overwrite were
        // last read by every thread's GEMM tiles, and ordinary stores stalled on
        // taking them back (half this function's time in a long prompt), while the
        // tiles that read them next are bound by compute, not by fetching them. A
        // decode batch's stay cached for its tiles, bound by memory.
        let stream = rows >= STREAM_ROWS;
        // A task quantizes `ROWS_PER_TASK` rows, block by block: each block index's
        // rows are neighbours in every output vector (one 64-byte line of scales),
        // so the writes fill whole lines rather than one value in each of `rows`
        // lines apart.
        let run = |t: usize| {
            let rs = t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(rows);
            // SAFETY: b·rows + row < blocks <= every vector's length for b < kb and
            // row < rows; the rows of task t are its own.
            unsafe { out.rows(&x[..blocks * 32], kb, rows, rs, stream) };
        };
        let tasks = rows.div_ceil(ROWS_PER_TASK);
        if tasks > 1 {
            parallel_for(tasks, &run);
        } else if tasks == 1 {
            run(0);
        }
    }

    /// Row `i` becomes row `rows[i]` of `src`: its blocks, scales and sums copied
    /// (bit for bit what quantizing that row again gives). A mixture's rows grouped
    /// by expert, each token's row once per expert it chose.
    pub fn gather(&mut self, src: &QuantActs, rows: &[u32]) {
        let (kb, m) = (src.kb, rows.len());
        (self.kb, self.rows, self.blocks) = (kb, m, kb * m);
        self.qs.grow(kb * m);
        self.d.grow(kb * m);
        self.sum.grow(kb * m);
        self.sum_lo.grow(kb * m);
        self.dsum.grow(kb * m);
        let out = BlockOut {
            qs: self.qs.as_mut_ptr(),
            d: self.d.as_mut_ptr(),
            sum: self.sum.as_mut_ptr(),
            sum_lo: self.sum_lo.as_mut_ptr(),
            dsum: self.dsum.as_mut_ptr(),
        };
        // One task per block index (its rows are side by side), many blocks a prompt's.
        let run = |b: usize| {
            for (i, &r) in rows.iter().enumerate() {
                // SAFETY: b·m + i < kb·m, the length every vector grew to; task b
                // alone writes blocks b·m..(b + 1)·m.
                unsafe { out.copy(b * m + i, src, src.at(r as usize, b)) };
            }
        };
        match m >= STREAM_ROWS {
            true => parallel_for(kb, &run),
            false => (0..kb).for_each(run),
        }
    }

    /// The index of block `b` of row `row` in every vector.
    #[inline(always)]
    pub fn at(&self, row: usize, b: usize) -> usize {
        b * self.rows + row
    }

    /// Fills `zero_lo`, `zero_hi` and `zero_all` for a panel with zero point `zero`,
    /// from the last `quantize`'s sums (exact: each within `32 · 127 · 255`).
    pub fn fold_zero(&mut self, zero: i32) {
        let blocks = self.blocks;
        self.zero_lo.grow(blocks);
        self.zero_hi.grow(blocks);
        self.zero_all.grow(blocks);
        let sums = self.sum[..blocks].iter().zip(&self.sum_lo[..blocks]);
        let out = self
            .zero_lo
            .iter_mut()
            .zip(self.zero_hi.iter_mut())
            .zip(self.zero_all.iter_mut());
        for (((lo, hi), all), (&sum, &sum_lo)) in out.zip(sums) {
            (*lo, *hi, *all) = (-zero * sum_lo, -zero * (sum - sum_lo), -zero * sum);
        }
    }

    /// Fills `halves` from the last `quantize`'s values: `q + 128 = 16·hi + lo`, both
    /// in `0..16`, so that an 8-bit weight times either half sums in 16 bits (the
    /// AVX2 GEMM's unsigned operand is the activation's half, its signed one the
    /// weight).
    pub fn split(&mut self) {
        let blocks = self.blocks;
        self.halves.grow(blocks);
        for (h, q) in self.halves.iter_mut().zip(&self.qs[..blocks]) {
            for ((lo, hi), &v) in h.lo.iter_mut().zip(&mut h.hi).zip(&q.0) {
                let u = (v as i32 + 128) as u8;
                (*lo, *hi) = (u & 15, u >> 4);
            }
        }
    }
}

/// Where `QuantActs::quantize`'s tasks write (disjoint blocks).
#[derive(Clone, Copy)]
struct BlockOut {
    qs: *mut Block,
    d: *mut f32,
    sum: *mut i32,
    sum_lo: *mut i32,
    dsum: *mut f32,
}
// SAFETY: tasks write disjoint indices (see `quantize`).
unsafe impl Send for BlockOut {}
unsafe impl Sync for BlockOut {}

impl BlockOut {
    /// Quantizes rows `rs` of `x` (`kb` blocks each, `rows` rows in all), block by
    /// block, so that each block's rows land side by side.
    ///
    /// # Safety
    /// `x` holds `rows · kb` blocks and every vector as many; no other thread
    /// writes rows `rs`.
    unsafe fn rows(self, x: &[f32], kb: usize, rows: usize, rs: Range<usize>, stream: bool) {
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::cpu::has_avx2() {
            return match stream {
                true => self.rows_avx2::<true>(x, kb, rows, rs),
                false => self.rows_avx2::<false>(x, kb, rows, rs),
            };
        }
        for b in 0..kb {
            for row in rs.clone() {
                let i = b * rows + row;
                let q = quantize_block(&x[(row * kb + b) * 32..][..32], &mut *self.qs.add(i));
                self.put::<false>(i, q);
            }
        }
    }

    /// `rows` with AVX2 (the block quantizer inlined); `STREAM`: with non-temporal
    /// stores, fenced at the end (before the pool reports the task done).
    ///
    /// # Safety
    /// As `rows`, and the CPU has AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn rows_avx2<const STREAM: bool>(
        self,
        x: &[f32],
        kb: usize,
        rows: usize,
        rs: Range<usize>,
    ) {
        use std::arch::x86_64::*;
        for b in 0..kb {
            for row in rs.clone() {
                let i = b * rows + row;
                let (values, q) = quantize_block_avx2(&x[(row * kb + b) * 32..][..32]);
                // Blocks are 32-byte aligned (`Block`).
                let to = self.qs.add(i) as *mut __m256i;
                match STREAM {
                    true => _mm256_stream_si256(to, values),
                    false => _mm256_store_si256(to, values),
                }
                self.put::<STREAM>(i, q);
            }
        }
        if STREAM {
            _mm_sfence();
        }
    }

    /// Block `from` of `src` as block `to`.
    ///
    /// # Safety
    /// Every vector holds block `to`, and no other thread writes it.
    #[inline(always)]
    unsafe fn copy(self, to: usize, src: &QuantActs, from: usize) {
        *self.qs.add(to) = src.qs[from];
        *self.d.add(to) = src.d[from];
        *self.sum.add(to) = src.sum[from];
        *self.sum_lo.add(to) = src.sum_lo[from];
        *self.dsum.add(to) = src.dsum[from];
    }

    /// Stores block `i`'s scale and sums (`STREAM`: non-temporal, x86-64 only).
    #[inline(always)]
    unsafe fn put<const STREAM: bool>(self, i: usize, q: Quantized) {
        let dsum = q.d * q.sum as f32;
        let words = [
            (self.d.add(i) as *mut i32, q.d.to_bits() as i32),
            (self.sum.add(i), q.sum),
            (self.sum_lo.add(i), q.sum_lo),
            (self.dsum.add(i) as *mut i32, dsum.to_bits() as i32),
        ];
        for (at, v) in words {
            #[cfg(target_arch = "x86_64")]
            if STREAM {
                std::arch::x86_64::_mm_stream_si32(at, v);
                continue;
            }
            *at = v;
        }
    }
}

/// What quantizing one block gives besides its values.
struct Quantized {
    /// The scale, rounded to f16 (as f32).
    d: f32,
    /// The sum of the 32 values, and of the first 16.
    sum: i32,
    sum_lo: i32,
}

/// One block: its values into `q`, its scale and sums (portable).
fn quantize_block(x: &[f32], q: &mut Block) -> Quantized {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (o, &v) in q.0.iter_mut().zip(x) {
        *o = f32::round(v * id) as i8;
    }
    let sum_of = |q: &[i8]| q.iter().map(|&v| v as i32).sum::<i32>();
    Quantized {
        d: f16::from_f32(d).to_f32(),
        sum: sum_of(&q.0),
        sum_lo: sum_of(&q.0[..16]),
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
/// One block's values (packed in order, for the caller to store), scale and sums.
unsafe fn quantize_block_avx2(x: &[f32]) -> (std::arch::x86_64::__m256i, Quantized) {
    use std::arch::x86_64::*;
    assert!(x.len() >= 32);
    let sign = _mm256_set1_ps(-0.0);
    let p = x.as_ptr();
    let v = [
        _mm256_loadu_ps(p),
        _mm256_loadu_ps(p.add(8)),
        _mm256_loadu_ps(p.add(16)),
        _mm256_loadu_ps(p.add(24)),
    ];
    let m = _mm256_max_ps(
        _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
        _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
    );
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
    let i = [
        round_away(v[0], id),
        round_away(v[1], id),
        round_away(v[2], id),
        round_away(v[3], id),
    ];
    let hsum = |s: __m256i| {
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
    };
    let lo = _mm256_add_epi32(i[0], i[1]);
    let (sum_lo, sum) = (
        hsum(lo),
        hsum(_mm256_add_epi32(lo, _mm256_add_epi32(i[2], i[3]))),
    );
    // The scale rounded to f16 and back (round to nearest even, as `half` does).
    let dh = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d));
    let d16 = _mm_cvtss_f32(_mm_cvtph_ps(dh));
    // Packing interleaves 4-value groups across the two 128-bit lanes; undo it.
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(i[0], i[1]),
        _mm256_packs_epi32(i[2], i[3]),
    );
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let q = Quantized {
        d: d16,
        sum,
        sum_lo,
    };
    (p, q)
}

/// `f32::round(v * id)` as i32: truncate, then step away from zero where the
/// dropped part is at least 1/2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn round_away(
    v: std::arch::x86_64::__m256,
    id: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    let v = _mm256_mul_ps(v, id);
    let t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    let step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0));
    let up = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5), _CMP_GE_OQ), step);
    _mm256_cvttps_epi32(_mm256_add_ps(t, up))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::k_quants::{BlockQ8_0, GgmlType};
    use rand::{Rng, SeedableRng};

    /// ggml's block layouts, to read candle's blocks.
    #[repr(C)]
    struct Q8_0 {
        d: f16,
        qs: [i8; 32],
    }

    /// Gathered rows are the rows quantized again, bit for bit: a few (serial) and a
    /// prompt's many (over the pool), repeated and out of order.
    #[test]
    fn gathered_rows_are_those_rows_quantized() {
        let (rows, kb) = (5, 6);
        let k = 32 * kb;
        let x = crate::kernels::cpu::test_data(rows * k, 4);
        let mut src = QuantActs::default();
        src.quantize(&x, k);
        for pick in [
            vec![2u32, 0, 2, 4],
            (0..STREAM_ROWS as u32 + 3).map(|i| i * 7 % 5).collect(),
        ] {
            let mut got = QuantActs::default();
            got.gather(&src, &pick);
            let xs: Vec<f32> = pick
                .iter()
                .flat_map(|&r| x[r as usize * k..][..k].to_vec())
                .collect();
            let mut want = QuantActs::default();
            want.quantize(&xs, k);
            assert_eq!((got.rows, got.kb), (want.rows, want.kb));
            for i in 0..pick.len() * kb {
                assert_eq!(got.qs[i].0, want.qs[i].0, "block {i}");
                let words =
                    |a: &QuantActs| (a.d[i].to_bits(), a.sum[i], a.sum_lo[i], a.dsum[i].to_bits());
                assert_eq!(words(&got), words(&want), "block {i}");
            }
        }
    }

    /// Five rows of eight blocks (ordinary stores), and 64 rows of 8 (streamed).
    #[test]
    fn equals_candles_quantizers_bit_for_bit() {
        for (rows, kb) in [(5, 8), (STREAM_ROWS, 8)] {
            equals_candles_quantizers(rows, kb);
        }
    }

    fn equals_candles_quantizers(rows: usize, kb: usize) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let (n, k) = (32 * kb * rows, 32 * kb);
        let mut x: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect();
        // Values at exactly half steps (x / scale = n + 1/2), a zero block, tiny values.
        for (j, v) in x[..32].iter_mut().enumerate() {
            *v = (j as f32 - 15.5) * 0.5;
        }
        x[32..64].fill(0.0);
        x[64..96].iter_mut().for_each(|v| *v *= 1e-30);
        let mut ours = QuantActs::default();
        ours.quantize(&x, k);
        let mut c0 = vec![BlockQ8_0::zeros(); n / 32];
        BlockQ8_0::from_float(&x, &mut c0);
        // SAFETY: the mirror has the block's repr(C) layout.
        let c0: &[Q8_0] =
            unsafe { std::slice::from_raw_parts(c0.as_ptr() as *const Q8_0, c0.len()) };
        for (j, c) in c0.iter().enumerate() {
            let i = ours.at(j / kb, j % kb);
            assert_eq!(ours.qs[i].0, c.qs, "block {j} values vs Q8_0");
            assert_eq!(ours.d[i], c.d.to_f32(), "block {j} scale");
            let sum: i32 = c.qs.iter().map(|&q| q as i32).sum();
            assert_eq!(ours.sum[i], sum, "block {j} value sum");
            assert_eq!(ours.dsum[i], ours.d[i] * sum as f32, "block {j} d · sum");
        }
    }
}
