//! `GgufFile`: opens a GGUF file with the checked header reader (`gguf_header`), turns
//! every failure into a `ModelError` naming the file, and reads typed metadata and tensors.
//! MXFP4 tensors (a type candle does not name) are read as the Q8_0 blocks that hold
//! their values (`crate::mxfp4`).

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value};
use candle_core::quantized::GgmlDType;

use crate::error::{ModelError, Result};
use crate::gguf_header::{read_header_all, tensor_nbytes, RawTensor};
use crate::mxfp4;
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
    /// The blocks' type as read (Q8_0 for an MXFP4 tensor).
    pub dtype: GgmlDType,
    /// `[rows, cols]`.
    pub dims: [usize; 2],
    pub row_bytes: usize,
}

/// An open GGUF file: its parsed header (metadata and tensor index) and a reader.
pub struct GgufFile {
    pub path: PathBuf,
    pub content: Content,
    /// The MXFP4 tensors (not in `content`).
    pub mxfp4: std::collections::HashMap<String, RawTensor>,
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
        let header = read_header_all(&mut reader, file_size).map_err(|e| ModelError::NotGguf {
            path: path.clone(),
            reason: if e.contains("GGUF magic") {
                e
            } else {
                format!("cannot parse the header: {e}")
            },
        })?;
        Ok(GgufFile {
            path,
            content: header.content,
            mxfp4: header.mxfp4,
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
        self.content.tensor_infos.contains_key(name) || self.mxfp4.contains_key(name)
    }

    /// Every tensor's element count and the type its blocks are read as (Q8_0 for
    /// MXFP4), with the file's bytes for it.
    pub fn tensor_sizes(&self) -> impl Iterator<Item = (&str, usize, GgmlDType, u64)> + '_ {
        let ggml = self.content.tensor_infos.iter().map(|(n, t)| {
            let elems = t.shape.elem_count();
            let bytes = tensor_nbytes(t.ggml_dtype, elems as u64).unwrap_or(0);
            (n.as_str(), elems, t.ggml_dtype, bytes)
        });
        let mx = self.mxfp4.iter().map(|(n, t)| {
            let elems: usize = t.dims.iter().product();
            let bytes = (elems / mxfp4::BLOCK * mxfp4::BLOCK_BYTES) as u64;
            (n.as_str(), elems, GgmlDType::Q8_0, bytes)
        });
        ggml.chain(mx)
    }

    /// An MXFP4 tensor read whole, as Q8_0 blocks.
    fn read_mxfp4(&mut self, name: &str) -> Result<(WeightData, Vec<usize>)> {
        let dims = self.mxfp4[name].dims.clone();
        let rows = dims[..dims.len() - 1].iter().product::<usize>();
        let mut buf = Vec::new();
        self.read_view(name, 0..rows, &mut buf, dims.len() > 2)?;
        let data = WeightData::from_bytes(GgmlDType::Q8_0, &buf).expect("Q8_0 is held");
        Ok((data, dims))
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
        if self.mxfp4.contains_key(name) {
            let (data, dims) = self.read_mxfp4(name)?;
            return Ok(
                match self
                    .quantize
                    .and_then(|ty| requantize::target(&self.content, ty, name, &dims))
                {
                    Some(to) => (requantize::requantize(data, to), dims),
                    None => (data, dims),
                },
            );
        }
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
        if let Some(t) = self.mxfp4.get(name) {
            return self.mxfp4_view(name, &t.dims, stacked, true);
        }
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

    /// `rows_view` of an MXFP4 tensor: read as Q8_0 rows. With `quantized`, `None` for
    /// a matrix `set_quantize` re-quantizes (as `rows_view`).
    fn mxfp4_view(
        &self,
        name: &str,
        dims: &[usize],
        stacked: bool,
        quantized: bool,
    ) -> Option<MatrixRows> {
        let (rows, cols) = match (dims, stacked) {
            (&[rows, cols], false) => (rows, cols),
            (&[n, rows, cols], true) => (n.checked_mul(rows)?, cols),
            _ => return None,
        };
        let requantized = self
            .quantize
            .and_then(|ty| requantize::target(&self.content, ty, name, &[rows, cols]));
        if quantized && !stacked && requantized.is_some() {
            return None;
        }
        Some(MatrixRows {
            dtype: GgmlDType::Q8_0,
            dims: [rows, cols],
            row_bytes: cols / mxfp4::BLOCK * mxfp4::Q8_0_BYTES,
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
        let view = match self.mxfp4.get(name) {
            // `read_mxfp4` reads a 3-D tensor whole through its stacked view, and any
            // matrix whole before it is re-quantized.
            Some(t) => self.mxfp4_view(name, &t.dims, stacked || t.dims.len() > 2, false),
            None => self.rows_view(name, stacked),
        };
        let Some(MatrixRows {
            dims: [n, cols],
            row_bytes,
            ..
        }) = view
        else {
            return Err(bad("not a matrix readable by rows".into()));
        };
        if rows.start > rows.end || rows.end > n {
            return Err(bad(format!("rows {rows:?} of {n}")));
        }
        let io_err = |e: std::io::Error| bad(e.to_string());
        if let Some(t) = self.mxfp4.get(name) {
            // The file's MXFP4 rows, converted to Q8_0 into `buf`.
            let file_row = cols / mxfp4::BLOCK * mxfp4::BLOCK_BYTES;
            let start = self.content.tensor_data_offset + t.offset + (rows.start * file_row) as u64;
            let mut raw = vec![0u8; rows.len() * file_row];
            self.reader.seek(SeekFrom::Start(start)).map_err(io_err)?;
            self.reader.read_exact(&mut raw).map_err(io_err)?;
            buf.clear();
            let inexact = mxfp4::to_q8_0(&raw, buf);
            if inexact > 0 {
                tracing::warn!(
                    tensor = name,
                    blocks = inexact,
                    "MXFP4 blocks outside Q8_0's exact range were rounded"
                );
            }
            return Ok(());
        }
        let info = &self.content.tensor_infos[name];
        // `read_header` checked that the whole tensor lies inside the file, so these
        // products are at most its byte size.
        let start = self.content.tensor_data_offset + info.offset + (rows.start * row_bytes) as u64;
        buf.resize(rows.len() * row_bytes, 0);
        self.reader.seek(SeekFrom::Start(start)).map_err(io_err)?;
        self.reader.read_exact(buf).map_err(io_err)
    }
}
