//! The hand-written CPU kernels, each choosing at run time (by CPU feature) between
//! its AVX2 path and a portable one: quantized, half-precision and packed matrix products,
//! the f32 GEMM, paged attention, RMS norm and the SiLU activation.

pub mod act_quant;
pub mod activation;
pub mod attention;
mod attention_bf16;
mod attention_f16;
mod attention_quant;
pub mod block_scales;
pub mod block_values;
pub mod cpu;
pub mod exp;
pub mod gemm_f32;
pub mod hadamard;
pub mod half_rows;
pub mod int8_gemm;
pub mod int8_panels;
pub mod isa_ledger;
pub mod lines;
pub mod norm;
pub mod packed_gemm;
pub mod pool;
pub mod qmatmul;
pub mod quant_dot;
pub mod quantize;
