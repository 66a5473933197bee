//! `GgufFile`: opens a GGUF file with the checked header reader (`gguf_header`), turns
//! every failure into a `ModelError` naming the file, and reads typed metadata and tensors.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value};
use candle_core::quantized::GgmlDType;

use crate::error::{ModelError, Result};
use crate::gguf_header::{read_header, tensor_nbytes};
use crate::requantize::{self, WeightType};
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

/// A matrix as `GgufFile::read_rows` reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixRows {
    pub dtype: GgmlDType,
    /// `[rows, cols]`.
    pub dims: [usize; 2],
    pub row_bytes: usize,
}

/// An open GGUF file: its parsed header (metadata and tensor index) and a reader.
pub struct GgufFile {
    pub path: PathBuf,
    pub content: Content,
    reader: BufReader<File>,
    /// `--quantize`: weight matrices are re-quantized to this type as they are read.
    quantize: Option<WeightType>,
}

/// What a path that is not a regular file is, for the error.
fn file_kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

impl GgufFile {
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        // Opening a FIFO (or a device) would block or read without end: only a
        // regular file (a symlink to one too) is opened.
        let meta = std::fs::metadata(&path).map_err(|source| ModelError::Open {
            path: path.clone(),
            source,
        })?;
        if !meta.is_file() {
            return Err(ModelError::NotAFile {
                kind: file_kind(&meta.file_type()),
                path,
            });
        }
        let file = File::open(&path).map_err(|source| ModelError::Open {
            path: path.clone(),
            source,
        })?;
        let file_size = file
            .metadata()
            .map_err(|source| ModelError::Open {
                path: path.clone(),
                source,
            })?
            .len();
        let mut reader = BufReader::new(file);
        let content = read_header(&mut reader, file_size).map_err(|e| ModelError::NotGguf {
            path: path.clone(),
            reason: if e.contains("GGUF magic") {
                e
            } else {
                format!("cannot parse the header: {e}")
            },
        })?;
        Ok(GgufFile {
            path,
            content,
            reader,
            quantize: None,
        })
    }

    /// Makes `read_tensor` re-quantize weight matrices to `ty` (see `requantize`).
    pub fn set_quantize(&mut self, ty: Option<WeightType>) {
        self.quantize = ty;
    }

    pub fn quantize(&self) -> Option<WeightType> {
        self.quantize
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

    /// Reads one tensor's blocks (re-quantized if `set_quantize` asked). Returns the data and its dims in GGUF order
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
        let path = self.path.clone();
        let bad = |reason: String| ModelError::BadTensor {
            path: path.clone(),
            tensor: name.to_string(),
            reason,
        };
        // `read_header` checked that the data lies inside the file.
        let nbytes = tensor_nbytes(dtype, info.shape.elem_count() as u64)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| bad("byte size overflows".into()))?;
        let start = self
            .content
            .tensor_data_offset
            .checked_add(info.offset)
            .ok_or_else(|| bad("data offset overflows".into()))?;
        let io_err = |e: std::io::Error| bad(e.to_string());
        self.reader.seek(SeekFrom::Start(start)).map_err(io_err)?;
        let mut data =
            WeightData::zeroed(dtype, nbytes).ok_or_else(|| ModelError::UnsupportedTensorType {
                path: self.path.clone(),
                tensor: name.to_string(),
                dtype: format!("{dtype:?}"),
                supported: supported_dtypes_list(),
            })?;
        if data.as_bytes().len() != nbytes {
            return Err(bad(format!(
                "{nbytes} bytes are not whole {dtype:?} blocks"
            )));
        }
        self.reader
            .read_exact(data.as_bytes_mut())
            .map_err(io_err)?;
        let data = match self
            .quantize
            .and_then(|ty| requantize::target(&self.content, ty, name, &dims))
        {
            Some(to) => requantize::requantize(data, to),
            None => data,
        };
        Ok((data, dims))
    }

    /// A matrix's type, shape `[rows, cols]` and bytes per row, when it can be read by
    /// rows as the file stores it (`read_rows`): `None` for a tensor that is not 2-D,
    /// whose rows are not whole blocks, or that `set_quantize` re-quantizes (read those
    /// with `read_tensor`).
    pub fn matrix_rows(&self, name: &str) -> Option<MatrixRows> {
        self.rows_view(name, false)
    }

    /// A 3-D tensor `[n, rows, cols]` (a mixture's experts, stacked) seen as the matrix
    /// `[n * rows, cols]`, read by `read_stacked_rows` in the file's own types (the
    /// caller re-quantizes what it reads).
    pub fn stacked_rows(&self, name: &str) -> Option<MatrixRows> {
        self.rows_view(name, true)
    }

    fn rows_view(&self, name: &str, stacked: bool) -> Option<MatrixRows> {
        let info = self.content.tensor_infos.get(name)?;
        let (rows, cols) = match (info.shape.dims(), stacked) {
            (&[rows, cols], false) => (rows, cols),
            // At most the tensor's element count, which `read_header` checked.
            (&[n, rows, cols], true) => (n.checked_mul(rows)?, cols),
            _ => return None,
        };
        let dims = [rows, cols];
        if !cols.is_multiple_of(info.ggml_dtype.block_size())
            || (!stacked
                && self
                    .quantize
                    .and_then(|ty| requantize::target(&self.content, ty, name, &dims))
                    .is_some())
        {
            return None;
        }
        let dtype = info.ggml_dtype;
        Some(MatrixRows {
            dtype,
            dims,
            // At most the tensor's byte size, which `read_header` checked.
            row_bytes: cols / dtype.block_size() * dtype.type_size(),
        })
    }

    /// Puts the file's blocks of rows `rows` of a matrix `matrix_rows` accepted in
    /// `buf` (reused: only growth is allocated).
    pub fn read_rows(
        &mut self,
        name: &str,
        rows: std::ops::Range<usize>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.read_view(name, rows, buf, false)
    }

    /// `read_rows` for a stack `stacked_rows` accepted.
    pub fn read_stacked_rows(
        &mut self,
        name: &str,
        rows: std::ops::Range<usize>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.read_view(name, rows, buf, true)
    }

    fn read_view(
        &mut self,
        name: &str,
        rows: std::ops::Range<usize>,
        buf: &mut Vec<u8>,
        stacked: bool,
    ) -> Result<()> {
        let bad = |reason: String| ModelError::BadTensor {
            path: self.path.clone(),
            tensor: name.to_string(),
            reason,
        };
        let Some(MatrixRows {
            dims: [n, _],
            row_bytes,
            ..
        }) = self.rows_view(name, stacked)
        else {
            return Err(bad("not a matrix readable by rows".into()));
        };
        if rows.start > rows.end || rows.end > n {
            return Err(bad(format!("rows {rows:?} of {n}")));
        }
        let info = &self.content.tensor_infos[name];
        // `read_header` checked that the whole tensor lies inside the file, so these
        // products are at most its byte size.
        let start = self.content.tensor_data_offset + info.offset + (rows.start * row_bytes) as u64;
        buf.resize(rows.len() * row_bytes, 0);
        let io_err = |e: std::io::Error| bad(e.to_string());
        self.reader.seek(SeekFrom::Start(start)).map_err(io_err)?;
        self.reader.read_exact(buf).map_err(io_err)
    }
}
