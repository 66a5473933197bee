//! `GgufFile`: opens a GGUF file with candle's reader, turns every failure into a
//! `ModelError` naming the file, and reads typed metadata and tensors.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value};
use candle_core::quantized::GgmlDType;

use crate::error::{ModelError, Result};
use crate::weights::WeightData;

/// Tensor types the forward pass can run.
pub const SUPPORTED_DTYPES: &[GgmlDType] = &[
    GgmlDType::F32,
    GgmlDType::F16,
    GgmlDType::BF16,
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q2K,
    GgmlDType::Q3K,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

pub fn supported_dtypes_list() -> String {
    SUPPORTED_DTYPES
        .iter()
        .map(|d| format!("{d:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An open GGUF file: its parsed header (metadata and tensor index) and a reader.
pub struct GgufFile {
    pub path: PathBuf,
    pub content: Content,
    reader: BufReader<File>,
    file_size: u64,
}

impl GgufFile {
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| ModelError::Open {
            path: path.clone(),
            source,
        })?;
        let file_size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut reader = BufReader::new(file);
        let mut magic = [0u8; 4];
        if reader.read_exact(&mut magic).is_err() || &magic != b"GGUF" {
            return Err(ModelError::NotGguf {
                path,
                reason: format!(
                    "the file does not start with the GGUF magic (found {:?})",
                    String::from_utf8_lossy(&magic)
                ),
            });
        }
        reader
            .seek(SeekFrom::Start(0))
            .map_err(|source| ModelError::Open {
                path: path.clone(),
                source,
            })?;
        let content = Content::read(&mut reader).map_err(|e| ModelError::NotGguf {
            path: path.clone(),
            reason: format!("cannot parse the header (truncated or corrupt?): {e}"),
        })?;
        let file = GgufFile {
            path,
            content,
            reader,
            file_size,
        };
        file.check_tensors_fit()?;
        Ok(file)
    }

    /// Every tensor's data must lie inside the file: catches truncated downloads at
    /// load time rather than halfway through.
    fn check_tensors_fit(&self) -> Result<()> {
        for (name, info) in &self.content.tensor_infos {
            let start = self.content.tensor_data_offset + info.offset;
            let end = start + tensor_bytes(info) as u64;
            if end > self.file_size {
                return Err(ModelError::NotGguf {
                    path: self.path.clone(),
                    reason: format!(
                        "file is truncated: tensor '{name}' ends at byte {end} but the file has {} bytes",
                        self.file_size
                    ),
                });
            }
        }
        Ok(())
    }

    pub fn meta(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn missing(&self, key: &str) -> ModelError {
        ModelError::MissingMetadata {
            path: self.path.clone(),
            key: key.to_string(),
        }
    }

    fn bad(&self, key: &str, reason: impl ToString) -> ModelError {
        ModelError::BadMetadata {
            path: self.path.clone(),
            key: key.to_string(),
            reason: reason.to_string(),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<String> {
        let v = self.meta(key).ok_or_else(|| self.missing(key))?;
        v.to_string().cloned().map_err(|e| self.bad(key, e))
    }

    /// Any integer-typed metadata value as usize.
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        let v = self.meta(key).ok_or_else(|| self.missing(key))?;
        let n = match v {
            Value::U8(x) => *x as i128,
            Value::I8(x) => *x as i128,
            Value::U16(x) => *x as i128,
            Value::I16(x) => *x as i128,
            Value::U32(x) => *x as i128,
            Value::I32(x) => *x as i128,
            Value::U64(x) => *x as i128,
            Value::I64(x) => *x as i128,
            _ => {
                return Err(self.bad(
                    key,
                    format!("expected an integer, got {:?}", v.value_type()),
                ))
            }
        };
        usize::try_from(n).map_err(|_| self.bad(key, format!("negative or too large: {n}")))
    }

    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.meta(key).ok_or_else(|| self.missing(key))?;
        match v {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            _ => Err(self.bad(key, format!("expected a float, got {:?}", v.value_type()))),
        }
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.content.tensor_infos.get(name)
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Checks that every tensor has a type the forward pass supports.
    pub fn check_dtypes(&self) -> Result<()> {
        let mut names: Vec<_> = self.content.tensor_infos.keys().collect();
        names.sort();
        for name in names {
            let info = &self.content.tensor_infos[name];
            if !SUPPORTED_DTYPES.contains(&info.ggml_dtype) {
                return Err(ModelError::UnsupportedTensorType {
                    path: self.path.clone(),
                    tensor: name.clone(),
                    dtype: format!("{:?}", info.ggml_dtype),
                    supported: supported_dtypes_list(),
                });
            }
        }
        Ok(())
    }

    /// Reads one tensor's raw blocks. Returns the data and its dims in GGUF order
    /// reversed (rows last): `(rows, cols)` for a matrix means `dims = [rows, cols]`.
    pub fn read_tensor(&mut self, name: &str) -> Result<(WeightData, Vec<usize>)> {
        let info =
            self.content
                .tensor_infos
                .get(name)
                .ok_or_else(|| ModelError::MissingTensor {
                    path: self.path.clone(),
                    tensor: name.to_string(),
                })?;
        let dims = info.shape.dims().to_vec();
        let dtype = info.ggml_dtype;
        let nbytes = tensor_bytes(info);
        let start = self.content.tensor_data_offset + info.offset;
        let path = self.path.clone();
        let io_err = |e: std::io::Error| ModelError::BadTensor {
            path: path.clone(),
            tensor: name.to_string(),
            reason: e.to_string(),
        };
        self.reader.seek(SeekFrom::Start(start)).map_err(io_err)?;
        let mut bytes = vec![0u8; nbytes];
        self.reader.read_exact(&mut bytes).map_err(io_err)?;
        let data = WeightData::from_bytes(dtype, &bytes).ok_or_else(|| {
            ModelError::UnsupportedTensorType {
                path: self.path.clone(),
                tensor: name.to_string(),
                dtype: format!("{dtype:?}"),
                supported: supported_dtypes_list(),
            }
        })?;
        Ok((data, dims))
    }
}

fn tensor_bytes(info: &TensorInfo) -> usize {
    let elems = info.shape.elem_count();
    elems / info.ggml_dtype.block_size() * info.ggml_dtype.type_size()
}
