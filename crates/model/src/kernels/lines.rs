//! `Lines<T>`: a growable buffer of plain values that starts on a 64-byte cache line,
//! so that threads writing disjoint, line-sized ranges of it never share a line.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

/// Types for which every bit pattern, zero included, is a value (no padding, no
/// invalid states), of alignment at most 64.
///
/// # Safety
/// Implementors must be plain old data as above.
pub unsafe trait Plain: Copy {}
// SAFETY: integers and floats have no invalid bit patterns.
unsafe impl Plain for i32 {}
// SAFETY: as above.
unsafe impl Plain for f32 {}

/// One cache line of storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A slice of `len` values of `T` whose first byte lies at a 64-byte boundary. It
/// only grows: `grow` keeps the values already there and zeroes the new ones.
pub struct Lines<T: Plain> {
    buf: Vec<Line>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Plain> Default for Lines<T> {
    fn default() -> Self {
        Lines {
            buf: Vec::new(),
            len: 0,
            _t: PhantomData,
        }
    }
}

impl<T: Plain> Lines<T> {
    /// Makes the slice at least `len` values long.
    pub fn grow(&mut self, len: usize) {
        if len <= self.len {
            return;
        }
        let lines = (len * size_of::<T>()).div_ceil(64);
        self.buf.resize(lines, Line([0; 64]));
        self.len = len;
    }
}

impl<T: Plain> Deref for Lines<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        const { assert!(align_of::<T>() <= 64) };
        // SAFETY: `buf` holds at least `len · size_of::<T>()` initialised bytes (`grow`),
        // aligned to 64 >= T's alignment, and any bytes are a `T` (`Plain`).
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr() as *const T, self.len) }
    }
}

impl<T: Plain> DerefMut for Lines<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as `deref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr() as *mut T, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_line_and_keeps_its_values_as_it_grows() {
        let mut v: Lines<i32> = Lines::default();
        assert!(v.is_empty());
        let mut filled = 0;
        for (len, want) in [(5, 5), (3, 5), (100, 100), (1000, 1000)] {
            v.grow(len);
            assert_eq!(v.len(), want);
            assert_eq!(v.as_ptr() as usize % 64, 0);
            for (i, x) in v.iter().enumerate() {
                let kept = if i < filled { i as i32 } else { 0 };
                assert_eq!(*x, kept, "value {i} after growing to {len}");
            }
            for (i, x) in v.iter_mut().enumerate() {
                *x = i as i32;
            }
            filled = v.len();
        }
    }
}
