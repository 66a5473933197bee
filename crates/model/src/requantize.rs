//! `--quantize`: the weight types a model can be re-quantized to at load, which
//! tensors each applies to (llama-quantize's rule), and the step itself (the file's
//! blocks dequantized to f32, then quantized by `kernels::quantize`).

use std::fmt;

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::GgmlDType;

use crate::gguf_header::tensor_nbytes;
use crate::kernels::quantize::{self as q, quantize_blocks};
use crate::weights::WeightData;

/// A weight type `--quantize` can choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightType {
    Q8_0,
    Q4_0,
    Q4_1,
    F16,
}

impl WeightType {
    pub const ALL: [WeightType; 4] = [
        WeightType::Q8_0,
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::F16,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            WeightType::Q8_0 => "q8_0",
            WeightType::Q4_0 => "q4_0",
            WeightType::Q4_1 => "q4_1",
            WeightType::F16 => "f16",
        }
    }

    pub fn dtype(self) -> GgmlDType {
        match self {
            WeightType::Q8_0 => GgmlDType::Q8_0,
            WeightType::Q4_0 => GgmlDType::Q4_0,
            WeightType::Q4_1 => GgmlDType::Q4_1,
            WeightType::F16 => GgmlDType::F16,
        }
    }

    /// The type of the output matrix (`output.weight`, or the token embedding when
    /// the output is tied to it). llama-quantize gives it Q6_K for the 4-bit types,
    /// falling back to Q8_0 when its rows are not a multiple of 256 values (as in
    /// SmolLM2's 576 and Gemma 3 270M's 640); we always use that Q8_0 (we write no
    /// Q6_K quantizer). Q8_0 and F16 keep their own type, as there.
    fn output_dtype(self) -> GgmlDType {
        match self {
            WeightType::F16 => GgmlDType::F16,
            _ => GgmlDType::Q8_0,
        }
    }
}

impl fmt::Display for WeightType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for WeightType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        WeightType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let names: Vec<_> = WeightType::ALL.iter().map(|t| t.name()).collect();
                format!(
                    "unknown weight type '{s}' (expected one of: {})",
                    names.join(", ")
                )
            })
    }
}

/// The type tensor `name` (dims `[rows, cols]`, or `[experts, rows, cols]`) gets
/// under `--quantize ty`, or `None` to keep the file's. Only weight matrices change
/// (norms and biases are vectors; a mixture's router stays as the file has it, as
/// llama.cpp's quantizer keeps it); a matrix whose rows do not split into whole
/// blocks keeps its type.
pub fn target(content: &Content, ty: WeightType, name: &str, dims: &[usize]) -> Option<GgmlDType> {
    let (&[_, cols] | &[_, _, cols]) = dims else {
        return None;
    };
    if !name.ends_with(".weight") || name.ends_with("ffn_gate_inp.weight") {
        return None;
    }
    let tied = !content.tensor_infos.contains_key("output.weight");
    let is_output = name == "output.weight" || (tied && name == "token_embd.weight");
    let to = if is_output {
        ty.output_dtype()
    } else {
        ty.dtype()
    };
    cols.is_multiple_of(to.block_size()).then_some(to)
}

/// `data` in type `to`: unchanged when already of that type, else dequantized to f32
/// and quantized again.
pub fn requantize(data: WeightData, to: GgmlDType) -> WeightData {
    if data.dtype() == to {
        return data;
    }
    let f = data.to_f32();
    let bytes = match to {
        GgmlDType::Q8_0 => quantize_blocks(&f, q::QK, q::Q8_0_BYTES, q::block_q8_0),
        GgmlDType::Q4_0 => quantize_blocks(&f, q::QK, q::Q4_0_BYTES, q::block_q4_0),
        GgmlDType::Q4_1 => quantize_blocks(&f, q::QK, q::Q4_1_BYTES, q::block_q4_1),
        GgmlDType::F16 => quantize_blocks(&f, 1, 2, q::block_f16),
        other => unreachable!("no quantizer for {other:?}"),
    };
    WeightData::from_bytes(to, &bytes).expect("a type WeightData holds")
}

/// What `--quantize` does to one file: per tensor its file type and effective type.
pub struct WeightPlan {
    /// `(name, file type, effective type, elements)`, sorted by name.
    pub tensors: Vec<(String, GgmlDType, GgmlDType, usize)>,
}

impl WeightPlan {
    pub fn new(content: &Content, ty: Option<WeightType>) -> Self {
        let mut tensors: Vec<_> = content
            .tensor_infos
            .iter()
            .map(|(name, info)| {
                let dims = info.shape.dims();
                let to = ty.and_then(|t| target(content, t, name, dims));
                let n = info.shape.elem_count();
                (
                    name.clone(),
                    info.ggml_dtype,
                    to.unwrap_or(info.ggml_dtype),
                    n,
                )
            })
            .collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        WeightPlan { tensors }
    }

    /// Bytes of all tensors in their effective types (as the file would store them).
    pub fn bytes(&self) -> u64 {
        self.tensors
            .iter()
            .map(|(_, _, to, n)| tensor_nbytes(*to, *n as u64).unwrap_or(0))
            .sum()
    }

    /// E.g. `Q4_0 x 210, Q8_0 x 1, F32 x 61 (76.4 MB)`: tensor counts by effective type.
    pub fn summary(&self) -> String {
        let mut counts: Vec<(GgmlDType, usize)> = Vec::new();
        for (_, _, to, _) in &self.tensors {
            match counts.iter_mut().find(|(d, _)| d == to) {
                Some(c) => c.1 += 1,
                None => counts.push((*to, 1)),
            }
        }
        counts.sort_by_key(|c| std::cmp::Reverse(c.1));
        let parts: Vec<_> = counts.iter().map(|(d, n)| format!("{d:?} x {n}")).collect();
        format!("{} ({:.1} MB)", parts.join(", "), self.bytes() as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_lists_choices_on_error() {
        for t in WeightType::ALL {
            assert_eq!(t.name().parse::<WeightType>(), Ok(t));
        }
        assert_eq!("Q8_0".parse::<WeightType>(), Ok(WeightType::Q8_0));
        let e = "q3_x".parse::<WeightType>().unwrap_err();
        assert!(
            e.contains("'q3_x'") && e.contains("q8_0, q4_0, q4_1, f16"),
            "{e}"
        );
    }

    #[test]
    fn requantize_round_trips_through_f32() {
        let f: Vec<f32> = (0..256)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let src = requantize(WeightData::F32(f.clone()), GgmlDType::Q8_0);
        assert_eq!(src.dtype(), GgmlDType::Q8_0);
        for to in WeightType::ALL.map(WeightType::dtype) {
            let out = requantize(src.clone(), to);
            assert_eq!(out.dtype(), to);
            let back = out.to_f32();
            let err = back.iter().zip(&f).map(|(a, b)| (a - b).abs());
            // 4-bit blocks of values in [-1, 1]: q4_0's step is 1/8, and its top
            // level is one step short of the largest magnitude's mirror image.
            assert!(err.fold(0f32, f32::max) < 0.13, "{to:?}");
        }
    }
}
