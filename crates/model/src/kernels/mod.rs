//! The hand-written CPU kernels, each choosing at run time (by CPU feature) between
//! its AVX2 path and a portable one: quantized and packed matrix products and paged
//! attention.

pub mod attention;
pub mod cpu;
pub mod packed_gemm;
pub mod qmatmul;
