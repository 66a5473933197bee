//! The 8-bit GEMM for prefill and large decode batches: activations quantized to
//! 8 bits per 32-value block (`act_quant`), weights as `Int8Panels` (exact integer
//! values), integer products summed exactly per block, then one float multiply-add
//! per block and output: `Σ_b d_w·d_a·(Σ q_w·q_a − zero·Σ q_a) + m_w·d_a·Σ q_a`.
//! Register tiles of up to 8 activation rows by 16 outputs with AVX-512 VNNI
//! (`vpdpbusd`: 64 products in one instruction), or 5 (4-bit) or 4 rows by 8 outputs with AVX2
//! (`vpmaddubsw`, pairs summed in 16 bits, which values of at most 5 bits cannot
//! overflow; 8-bit values are split into two nibbles). A panel's blocks stay in L1
//! across the row tiles of a task. From one row up: the same kernel serves decode
//! at batch 1 (memory-bound: 4-bit values read as nibbles) and prompts.
//!
//! Each output is summed block by block in order whatever the batch, so results do
//! not depend on the batch's size or the row's place in it.

use std::cell::RefCell;
use std::ops::Range;

use crate::kernels::act_quant::QuantActs;
use crate::kernels::cpu::{has_avx2, has_avx512_vnni, OutPtr};
use crate::kernels::int8_panels::{Group, Int8Panels, Lanes, Packing, Scales, NR};
use crate::kernels::pool::parallel_tiles;

mod avx2;
mod gemv;
mod parts;
mod scales;
use avx2::{avx2_values, tile_avx2, BYTES, NIBBLES, SIX, WIDE};
pub use parts::{matmul_parts, Part, PartTask};

/// Tiles of at most this many rows (decode at batch 1 or 2, bound by the bytes they
/// read) prefetch each panel `PREFETCH_BLOCKS` blocks ahead: at one row the loads
/// alone do not keep enough misses in flight (Q4_K's output-matrix GEMV on 2 cores,
/// `--rows 1 --shape 151936,1536`: 71.5 against 89.8 GOP/s, medians of 5).
pub(super) const PREFETCH_ROWS: usize = 2;
pub(super) const PREFETCH_BLOCKS: usize = 4;

/// Activation rows per task: `MC · k` bytes of them stay in L2.
const MC: usize = 64;

/// Which instruction set multiplies.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Isa {
    Avx512Vnni,
    Avx2,
}

impl Isa {
    /// The best this CPU has, if any.
    pub fn best() -> Option<Isa> {
        [Isa::Avx512Vnni, Isa::Avx2]
            .into_iter()
            .find(|isa| isa.available())
    }

    /// Whether this CPU has `self`.
    pub fn available(self) -> bool {
        match self {
            Isa::Avx512Vnni => has_avx512_vnni(),
            Isa::Avx2 => has_avx2(),
        }
    }

    /// How panels for this instruction set keep their values: with AVX-512, 5- and
    /// 6-bit values as nibbles and high planes (merged back with one `vpternlogd` a
    /// vector); with AVX2, whose merge takes three instructions and slowed Q6_K
    /// prompts, as bytes (see `Packing`).
    pub fn packing(self) -> Packing {
        match self {
            Isa::Avx512Vnni => Packing::Planes,
            Isa::Avx2 => Packing::Nibbles,
        }
    }

    /// Rows per register tile for `w`: on AVX2, 4-bit panels take five (2·5
    /// accumulators, each weight vector's nibbles split once for five rows), the
    /// others, and 4-bit panels with two scales a block (a 16-bit sum per half),
    /// four (their 16-bit sums need a third register per row).
    fn rows(self, w: &Int8Panels) -> usize {
        match self {
            Isa::Avx512Vnni => 8,
            Isa::Avx2 if avx2_values(w) == NIBBLES && !w.sub => 5,
            Isa::Avx2 => 4,
        }
    }
}

thread_local! {
    static ACTS: RefCell<QuantActs> = RefCell::new(QuantActs::default());
    /// A worker's current panel's scales as f32 (`scales::expand`).
    static PANEL_LANES: RefCell<Vec<Lanes>> = const { RefCell::new(Vec::new()) };
    /// A worker's current panel's values one byte each (`Int8Panels::panel_bytes`).
    static PANEL_BYTES: RefCell<Vec<Group>> = const { RefCell::new(Vec::new()) };
}

/// `out[m, n] = x[m, k] · Wᵀ` on `isa` (one that is `available` for `w`).
pub fn matmul(w: &Int8Panels, isa: Isa, x: &[f32], m: usize, out: &mut [f32]) {
    let (n, k) = (w.n, w.k);
    assert!(x.len() >= m * k && out.len() >= m * n && k.is_multiple_of(32));
    assert!(
        isa.available(),
        "{isa:?} cannot multiply these weights here"
    );
    assert!(!w.has_min || w.zero == 0, "a minimum and a zero point");
    if m == 0 || n == 0 {
        return;
    }
    ACTS.with(|cell| {
        let acts = &mut *cell.borrow_mut();
        acts.quantize(&x[..m * k], k);
        ready(acts, w, isa);
        let acts: &QuantActs = acts;
        let out = OutPtr(out.as_mut_ptr());
        parallel_tiles(m, MC, n.div_ceil(NR), &|rows, panels| {
            // SAFETY: `parallel_tiles` hands each (row, panel) to one task; out holds
            // m rows of n; acts holds m rows of w.kb blocks, readied for w; the CPU
            // has `isa` (checked above).
            unsafe { run_task(w, isa, acts, rows, panels, out, n) }
        });
    });
}

/// Readies quantized activations for `w`'s tiles on `isa`: `w`'s zero point folded
/// into where the sums start, or (8-bit values on AVX2) the values split.
fn ready(acts: &mut QuantActs, w: &Int8Panels, isa: Isa) {
    if folds_zero(w) {
        acts.fold_zero(w.zero);
    }
    if isa == Isa::Avx2 && avx2_values(w) == WIDE {
        // The tile reads `stored ^ 0x80` as `stored - zero`.
        assert_eq!(w.zero, 128, "8-bit values with another zero point");
        acts.split();
    }
}

/// Rows `rows` of `acts` times `w`'s panels `panels`, into the same rows of `out`
/// (row stride `ldc`): one task of a product.
///
/// # Safety
/// `out` holds those rows' columns of the panels, and no other task writes them;
/// `acts` holds the rows, of `w.kb` blocks, `ready` for `w`; the CPU has `isa`.
unsafe fn run_task(
    w: &Int8Panels,
    isa: Isa,
    acts: &QuantActs,
    rows: Range<usize>,
    panels: Range<usize>,
    out: OutPtr,
    ldc: usize,
) {
    let expand = scales::expands(w, isa, rows.len());
    let merge = merges_once(w, isa, rows.len());
    let (lanes, bytes) = (&PANEL_LANES, &PANEL_BYTES);
    lanes.with_borrow_mut(|lanes| {
        bytes.with_borrow_mut(|bytes| {
            for p in panels {
                if expand {
                    // SAFETY: `expands` checked the scales are `Factored`; p is one of
                    // w's panels; the caller has `isa`.
                    unsafe { scales::expand(w, isa, p, lanes) };
                }
                let pre = match expand {
                    true => lanes.as_ptr(),
                    false => std::ptr::null(),
                };
                let vals = match merge {
                    true => {
                        w.panel_bytes(p, bytes);
                        bytes.as_ptr()
                    }
                    false => w.groups[p * w.kb * w.groups_per_block()..].as_ptr(),
                };
                let mut r = rows.start;
                while r < rows.end {
                    let mr = isa.rows(w).min(rows.end - r);
                    // SAFETY: rows r..r+mr and panel p's columns lie inside out and
                    // only this task writes them (the caller's word); acts holds those
                    // rows; `pre`, when set, holds panel p's lanes; `vals` holds its
                    // values, one byte each where `merge`.
                    unsafe { tile(isa, mr, w, p, (vals, merge), acts, r, out, ldc, pre) };
                    r += mr;
                }
            }
        })
    });
}

/// Whether a task's tiles read `w`'s values from one byte copy of each panel
/// (`Int8Panels::panel_bytes`) instead of merging its nibbles and high planes in
/// every tile: with AVX2 (three instructions a vector to merge, where AVX-512 takes
/// one), for a task of more than one tile of rows. At one tile the merge is cheap
/// beside the bytes it saves reading (decode is bound by them).
fn merges_once(w: &Int8Panels, isa: Isa, rows: usize) -> bool {
    isa == Isa::Avx2 && w.high && rows > isa.rows(w)
}

/// Whether the tiles start `w`'s integer sums at `QuantActs::fold_zero`'s terms (a
/// zero point, subtracted per half or per block) rather than at zero.
fn folds_zero(w: &Int8Panels) -> bool {
    w.zero != 0 && !w.int_halves()
}

/// `int_halves` panels with a zero point (Q3_K): each half's `zero · Σ q_a`, as
/// the 16-bit pair (first half, second half) the tiles subtract from their sums.
fn zero_pair(w: &Int8Panels, sum: i32, lo: i32) -> i32 {
    ((w.zero * lo) & 0xFFFF) | ((w.zero * (sum - lo)) << 16)
}

/// Dispatches a tile of `rows` rows to its monomorphised kernel.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    isa: Isa,
    rows: usize,
    w: &Int8Panels,
    p: usize,
    (vals, bytes): (*const Group, bool),
    a: &QuantActs,
    r0: usize,
    out: OutPtr,
    ldc: usize,
    pre: *const Lanes,
) {
    let c = out.get().add(r0 * ldc + p * NR);
    let cols = NR.min(w.n - p * NR);
    let v = if bytes { BYTES } else { avx2_values(w) };
    if isa == Isa::Avx2 && rows == 1 && gemv::fits(w, v) {
        return match (v, w.sub) {
            (NIBBLES, _) => gemv::gemv_avx2::<NIBBLES, false>(w, p, vals, a, r0, c, cols),
            (SIX, true) => gemv::gemv_avx2::<SIX, true>(w, p, vals, a, r0, c, cols),
            (SIX, false) => gemv::gemv_avx2::<SIX, false>(w, p, vals, a, r0, c, cols),
            (_, true) => gemv::gemv_avx2::<BYTES, true>(w, p, vals, a, r0, c, cols),
            (_, false) => gemv::gemv_avx2::<BYTES, false>(w, p, vals, a, r0, c, cols),
        };
    }
    macro_rules! run {
        ($kernel:ident, $c1:tt, $c2:tt, $c3:tt; $($r:literal)*) => {
            match rows {
                $($r => $kernel::<$r, $c1, $c2, $c3>(w, p, vals, a, r0, c, ldc, cols, pre),)*
                _ => unreachable!("tile rows"),
            }
        };
    }
    match (isa, w.nibbles, w.high, w.sub) {
        (Isa::Avx512Vnni, true, false, true) => run!(tile_vnni, true, false, true; 1 2 3 4 5 6 7 8),
        (Isa::Avx512Vnni, true, false, false) => {
            run!(tile_vnni, true, false, false; 1 2 3 4 5 6 7 8)
        }
        (Isa::Avx512Vnni, true, true, true) => run!(tile_vnni, true, true, true; 1 2 3 4 5 6 7 8),
        (Isa::Avx512Vnni, true, true, false) => run!(tile_vnni, true, true, false; 1 2 3 4 5 6 7 8),
        (Isa::Avx512Vnni, false, _, true) => run!(tile_vnni, false, false, true; 1 2 3 4 5 6 7 8),
        (Isa::Avx512Vnni, false, _, false) => {
            run!(tile_vnni, false, false, false; 1 2 3 4 5 6 7 8)
        }
        // A task's byte copy of the panel's nibbles and high planes (`merges_once`).
        (Isa::Avx2, ..) if bytes => match (w.has_min, w.sub) {
            (_, true) => run!(tile_avx2, BYTES, false, true; 1 2 3 4),
            (true, false) => run!(tile_avx2, BYTES, true, false; 1 2 3 4),
            (false, false) => run!(tile_avx2, BYTES, false, false; 1 2 3 4),
        },
        (Isa::Avx2, ..) => match (avx2_values(w), w.has_min, w.sub) {
            // Two scales a block: Q2_K's minimums are read as `int_halves` reads them.
            (NIBBLES, _, true) => run!(tile_avx2, NIBBLES, false, true; 1 2 3 4),
            (BYTES, _, true) => run!(tile_avx2, BYTES, false, true; 1 2 3 4),
            (SIX, _, true) => run!(tile_avx2, SIX, false, true; 1 2 3 4),
            (SIX, true, false) => run!(tile_avx2, SIX, true, false; 1 2 3 4),
            (SIX, false, false) => run!(tile_avx2, SIX, false, false; 1 2 3 4),
            (NIBBLES, true, false) => run!(tile_avx2, NIBBLES, true, false; 1 2 3 4 5),
            (NIBBLES, false, false) => run!(tile_avx2, NIBBLES, false, false; 1 2 3 4 5),
            (BYTES, true, false) => run!(tile_avx2, BYTES, true, false; 1 2 3 4),
            (BYTES, false, false) => run!(tile_avx2, BYTES, false, false; 1 2 3 4),
            (WIDE, false, false) => run!(tile_avx2, WIDE, false, false; 1 2 3 4),
            _ => unreachable!("value kinds"),
        },
    }
}

/// `c[R, cols] = rows r0..r0+R of a · panel p` with AVX-512 VNNI. `NIB`: the panel's
/// 4-bit values are packed (each 64-byte vector holds groups `g` and `g + 4`, split
/// with a mask and a shift), else one byte each. `HIGH` (with `NIB`): bits 4-5 of
/// each value come from the block's high planes, shifted into place and merged
/// (one `vpternlogd`). `SUB`: two scales per block (Q2_K,
/// Q3_K, Q6_K), each half's integer sums apart (with `NIB` the low nibbles are the
/// first half, the high the second): Q6_K's scaled apart in float, Q2_K's and
/// Q3_K's (`int_halves`) times their integer scales and summed in integers.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_vnni<const R: usize, const NIB: bool, const HIGH: bool, const SUB: bool>(
    w: &Int8Panels,
    p: usize,
    vals: *const Group,
    a: &QuantActs,
    r0: usize,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    pre: *const Lanes,
) {
    use std::arch::x86_64::*;
    let (kb, per) = (w.kb, w.groups_per_block());
    let gp = vals as *const __m512i;
    let lpb = w.lanes_per_block();
    // Lane row `i` of the panel's scales (block b: scales b·lpb, minimums b·lpb + 1).
    let lanes = |i: usize| match &w.scales {
        _ if !pre.is_null() => _mm512_load_ps(pre.add(i) as *const f32),
        Scales::F16(s) => _mm512_cvtph_ps(_mm256_load_si256(
            s.as_ptr().add(p * kb * lpb + i) as *const __m256i
        )),
        Scales::F32(s) => _mm512_load_ps(s.as_ptr().add(p * kb * lpb + i) as *const f32),
        Scales::Factored { .. } => scales::lane_512(w, p, i),
    };
    let low = _mm512_set1_epi8(0x0F);
    let fold = folds_zero(w);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..kb {
        let mut s = [_mm512_setzero_si512(); R];
        let mut s_lo = [_mm512_setzero_si512(); R];
        if fold {
            // The zero point's `-zero · Σ q_a` (per half with SUB) as the sums' start.
            for r in 0..R {
                let i = a.at(r0 + r, b);
                match SUB {
                    true => {
                        s_lo[r] = _mm512_set1_epi32(*a.zero_lo.get_unchecked(i));
                        s[r] = _mm512_set1_epi32(*a.zero_hi.get_unchecked(i));
                    }
                    false => s[r] = _mm512_set1_epi32(*a.zero_all.get_unchecked(i)),
                }
            }
        }
        // Group `g`'s weights times every row's 4 activations at 4g, into `s`.
        let dot = |s: &mut [__m512i; R], wv: __m512i, g: usize| {
            for (r, s) in s.iter_mut().enumerate() {
                let q = a.qs.get_unchecked(a.at(r0 + r, b)).0.as_ptr() as *const i32;
                let av = _mm512_set1_epi32(q.add(g).read_unaligned());
                *s = _mm512_dpbusd_epi32(*s, wv, av);
            }
        };
        let raw = |v: usize| _mm512_load_si512(gp.add(b * per + v));
        if R <= PREFETCH_ROWS {
            // A hint only: past the panel's end it reads nothing and faults never.
            for v in 0..per {
                _mm_prefetch::<_MM_HINT_T0>(
                    gp.wrapping_add((b + PREFETCH_BLOCKS) * per + v) as *const i8
                );
            }
        }
        if NIB {
            let planes = match HIGH {
                true => [raw(4), raw(5)],
                false => [_mm512_setzero_si512(); 2],
            };
            let bits45 = _mm512_set1_epi8(0x30);
            for v in 0..4 {
                let raw = raw(v);
                let mut first_half = _mm512_and_si512(raw, low);
                let mut second_half = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
                if HIGH {
                    // Field v of each plane (bits 2v, 2v + 1 of every byte) to bits 4-5:
                    // in 16-bit lanes, as the mask keeps only bits from the same byte.
                    let field = |h: __m512i| match v {
                        0 => _mm512_slli_epi16(h, 4),
                        1 => _mm512_slli_epi16(h, 2),
                        2 => h,
                        _ => _mm512_srli_epi16(h, 2),
                    };
                    // a | (b & c)
                    first_half =
                        _mm512_ternarylogic_epi32(first_half, field(planes[0]), bits45, 0xF8);
                    second_half =
                        _mm512_ternarylogic_epi32(second_half, field(planes[1]), bits45, 0xF8);
                }
                // With SUB, the low nibbles (groups 0..4) are the first half.
                let first = if SUB { &mut s_lo } else { &mut s };
                dot(first, first_half, v);
                dot(&mut s, second_half, v + 4);
            }
        } else if SUB {
            // Each half's groups into its own sums (two loops, so both arrays stay
            // in registers).
            for v in 0..per / 2 {
                dot(&mut s_lo, raw(v), v);
            }
            for v in per / 2..per {
                dot(&mut s, raw(v), v);
            }
        } else {
            for v in 0..per {
                dot(&mut s, raw(v), v);
            }
        }
        if SUB && w.int_halves() {
            // Q2_K, Q3_K as llama.cpp sums them: each half's sum (within 16 bits,
            // Q3_K's zero point subtracted there) times its small integer scale, both
            // halves in one `vpmaddwd` (exact); the minimums times the halves'
            // activation sums likewise; then one float multiply-add per super-block
            // factor.
            let (outer, inner, signed) = w.block_factors(p, b);
            let factor = |o: usize| {
                _mm512_cvtph_ps(_mm256_load_si256(outer.as_ptr().add(o) as *const __m256i))
            };
            let raw = inner.as_ptr() as *const __m128i;
            // Each column's integers for the two halves (lanes l, l + 1), as one
            // 16-bit pair.
            let pairs = |l: usize| {
                let (x, y) = (_mm_load_si128(raw.add(l)), _mm_load_si128(raw.add(l + 1)));
                let both = _mm256_inserti128_si256::<1>(
                    _mm256_castsi128_si256(_mm_unpacklo_epi8(x, y)),
                    _mm_unpackhi_epi8(x, y),
                );
                match signed {
                    true => _mm512_cvtepi8_epi16(both),
                    false => _mm512_cvtepu8_epi16(both),
                }
            };
            let (d, sc) = (factor(0), pairs(0));
            let (dmin, mn) = match w.has_min {
                true => (factor(1), pairs(2)),
                false => (_mm512_setzero_ps(), _mm512_setzero_si512()),
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                let i = a.at(r0 + r, b);
                let (sum, lo) = (*a.sum.get_unchecked(i), *a.sum_lo.get_unchecked(i));
                let mut halves =
                    _mm512_mask_blend_epi16(0xAAAA_AAAA, s_lo[r], _mm512_slli_epi32::<16>(s[r]));
                if w.zero != 0 {
                    // Σ (q - zero)·q_a per half, within 16·4·127: exact in 16 bits.
                    halves = _mm512_sub_epi16(halves, _mm512_set1_epi32(zero_pair(w, sum, lo)));
                }
                let t = _mm512_madd_epi16(halves, sc);
                let da = _mm512_set1_ps(*a.d.get_unchecked(i));
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(d, da), *acc);
                if w.has_min {
                    // The halves' activation sums (each within 16·127) as a 16-bit
                    // pair, times the minimums' integers; the minimums are `-(dmin·mn)`.
                    let sums = _mm512_set1_epi32((lo & 0xFFFF) | ((sum - lo) << 16));
                    let m = _mm512_cvtepi32_ps(_mm512_madd_epi16(sums, mn));
                    *acc = _mm512_fnmadd_ps(m, _mm512_mul_ps(dmin, da), *acc);
                }
            }
            continue;
        }
        let d = lanes(b * lpb);
        if SUB {
            let d_hi = lanes(b * lpb + 1);
            for (r, acc) in acc.iter_mut().enumerate() {
                // The sums started at the zero point's terms (`fold`).
                let da = _mm512_set1_ps(*a.d.get_unchecked(a.at(r0 + r, b)));
                let (t_lo, t_hi) = (s_lo[r], s[r]);
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t_lo), _mm512_mul_ps(d, da), *acc);
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t_hi), _mm512_mul_ps(d_hi, da), *acc);
            }
            continue;
        }
        let m = if w.has_min {
            lanes(b * lpb + 1)
        } else {
            _mm512_setzero_ps()
        };
        for (r, acc) in acc.iter_mut().enumerate() {
            let i = a.at(r0 + r, b);
            // A zero point's terms are in the sums already (`fold`).
            let t = s[r];
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(*a.d.get_unchecked(i)));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), scale, *acc);
            if w.has_min {
                *acc = _mm512_fmadd_ps(m, _mm512_set1_ps(*a.dsum.get_unchecked(i)), *acc);
            }
        }
    }
    let mask = if cols == NR {
        0xFFFF
    } else {
        (1u16 << cols) - 1
    };
    for (r, acc) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(c.add(r * ldc), mask, *acc);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile_vnni<const R: usize, const NIB: bool, const HIGH: bool, const SUB: bool>(
    w: &Int8Panels,
    p: usize,
    vals: *const Group,
    a: &QuantActs,
    r0: usize,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    pre: *const Lanes,
) {
    tile_avx2::<R, 0, false, SUB>(w, p, vals, a, r0, c, ldc, cols, pre)
}

#[cfg(test)]
mod tests;
