//! The GGUF header reader (metadata and tensor index) for files that may be hostile:
//! every length is checked against the bytes left in the file before anything is
//! allocated, offsets and sizes use checked arithmetic, and each error names the field.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value, VersionedMagic};
use candle_core::quantized::GgmlDType;

/// Arrays may nest (the spec allows it); deeper than this is refused.
const MAX_DEPTH: usize = 4;
/// Dimensions per tensor (ggml's GGML_MAX_DIMS).
const MAX_DIMS: usize = 4;
/// Metadata values in all arrays together. Each costs 32 bytes in memory but may be a
/// single byte on disk; the largest real vocabularies need about a million.
pub const MAX_METADATA_VALUES: u64 = 1 << 24;
/// Tensor data is aligned to this unless `general.alignment` says otherwise.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// GGML type ids as written in GGUF files (ggml.h), for the types candle knows.
pub fn dtype_from_id(id: u32) -> Option<GgmlDType> {
    Some(match id {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

/// GGML's MXFP4 (`crate::mxfp4`), a type candle's `GgmlDType` has no name for.
pub const MXFP4_ID: u32 = 39;

/// A tensor of a type outside candle's `GgmlDType` (MXFP4): its dims (rows last, as
/// `TensorInfo`'s) and its data offset from the start of the tensor data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawTensor {
    pub dims: Vec<usize>,
    pub offset: u64,
}

/// A parsed header: candle's `Content` (metadata, and the tensors of the types candle
/// names) and the MXFP4 tensors beside it.
pub struct Header {
    pub content: Content,
    pub mxfp4: HashMap<String, RawTensor>,
}

/// A tensor's type as the header gives it.
#[derive(Clone, Copy, Debug)]
enum FileType {
    Ggml(GgmlDType),
    Mxfp4,
}

impl FileType {
    fn name(self) -> String {
        match self {
            FileType::Ggml(d) => format!("{d:?}"),
            FileType::Mxfp4 => "MXFP4".into(),
        }
    }

    fn block_size(self) -> usize {
        match self {
            FileType::Ggml(d) => d.block_size(),
            FileType::Mxfp4 => crate::mxfp4::BLOCK,
        }
    }

    fn nbytes(self, elems: u64) -> Option<u64> {
        match self {
            FileType::Ggml(d) => tensor_nbytes(d, elems),
            FileType::Mxfp4 => {
                let b = crate::mxfp4::BLOCK as u64;
                elems
                    .is_multiple_of(b)
                    .then(|| (elems / b).checked_mul(crate::mxfp4::BLOCK_BYTES as u64))?
            }
        }
    }
}

/// Bytes of a tensor of `elems` elements of `dtype`; `None` if the element count is
/// not a whole number of blocks or the size overflows.
pub fn tensor_nbytes(dtype: GgmlDType, elems: u64) -> Option<u64> {
    let block = dtype.block_size() as u64;
    if !elems.is_multiple_of(block) {
        return None;
    }
    (elems / block).checked_mul(dtype.type_size() as u64)
}

struct Reader<'a, R> {
    r: &'a mut R,
    pos: u64,
    size: u64,
    /// Version 1 writes lengths and dimensions as u32, later versions as u64.
    v1: bool,
    values: u64,
}

type Res<T> = std::result::Result<T, String>;

impl<R: Read> Reader<'_, R> {
    fn left(&self) -> u64 {
        self.size.saturating_sub(self.pos)
    }

    fn bytes(&mut self, n: u64, what: &dyn Fn() -> String) -> Res<Vec<u8>> {
        if n > self.left() {
            return Err(format!(
                "{}: needs {n} bytes at offset {}, but the file has only {} left (truncated or corrupt)",
                what(),
                self.pos,
                self.left()
            ));
        }
        let mut buf = vec![0u8; n as usize];
        self.r
            .read_exact(&mut buf)
            .map_err(|e| format!("{}: {e}", what()))?;
        self.pos += n;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Res<[u8; N]> {
        let v = self.bytes(N as u64, what)?;
        Ok(v.try_into().expect("read exactly N bytes"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Res<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Res<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length or count (u32 in version 1, u64 after).
    fn len(&mut self, what: &dyn Fn() -> String) -> Res<u64> {
        if self.v1 {
            self.u32(what).map(u64::from)
        } else {
            self.u64(what)
        }
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Res<String> {
        let n = self.len(what)?;
        let mut v = self.bytes(n, &|| format!("{} (a string of {n} bytes)", what()))?;
        // Writers sometimes NUL-terminate; GGUF strings are not.
        while v.last() == Some(&0) {
            v.pop();
        }
        Ok(String::from_utf8_lossy(&v).into_owned())
    }

    /// The smallest on-disk size of one value of GGUF type `ty`.
    fn min_size(&self, ty: u32) -> u64 {
        let len = if self.v1 { 4 } else { 8 };
        match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 => len,
            9 => 4 + len,
            _ => 8,
        }
    }

    fn value(&mut self, ty: u32, depth: usize, what: &dyn Fn() -> String) -> Res<Value> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>(what)?[0]),
            1 => Value::I8(self.array::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("{}: bool value {b} is neither 0 nor 1", what())),
            },
            8 => Value::String(self.string(what)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(format!("{}: arrays nested deeper than {MAX_DEPTH}", what()));
                }
                let elem = self.u32(what)?;
                if elem > 12 {
                    return Err(format!("{}: unknown array element type {elem}", what()));
                }
                let n = self.len(what)?;
                let need = n.saturating_mul(self.min_size(elem));
                if need > self.left() {
                    return Err(format!(
                        "{}: an array of {n} elements needs at least {need} bytes, but the file has only {} left",
                        what(),
                        self.left()
                    ));
                }
                self.values = self.values.saturating_add(n);
                if self.values > MAX_METADATA_VALUES {
                    return Err(format!(
                        "{}: more than {MAX_METADATA_VALUES} metadata values in total",
                        what()
                    ));
                }
                let mut out = Vec::with_capacity(n.min(4096) as usize);
                for i in 0..n {
                    out.push(self.value(elem, depth + 1, &|| format!("{}[{i}]", what()))?);
                }
                Value::Array(out)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            t => return Err(format!("{}: unknown value type {t}", what())),
        })
    }
}

/// `general.alignment`: absent means 32; otherwise a non-negative integer that is a
/// non-zero power of two.
fn alignment(metadata: &HashMap<String, Value>) -> Res<u64> {
    let key = "general.alignment";
    let a = match metadata.get(key) {
        None => return Ok(DEFAULT_ALIGNMENT),
        Some(Value::U8(v)) => u64::from(*v),
        Some(Value::U16(v)) => u64::from(*v),
        Some(Value::U32(v)) => u64::from(*v),
        Some(Value::U64(v)) => *v,
        Some(Value::I8(v)) => u64::try_from(*v).unwrap_or(0),
        Some(Value::I16(v)) => u64::try_from(*v).unwrap_or(0),
        Some(Value::I32(v)) => u64::try_from(*v).unwrap_or(0),
        Some(Value::I64(v)) => u64::try_from(*v).unwrap_or(0),
        Some(v) => {
            return Err(format!(
                "metadata '{key}': expected an integer, got {:?}",
                v.value_type()
            ))
        }
    };
    if a == 0 || !a.is_power_of_two() {
        return Err(format!(
            "metadata '{key}': alignment {a} is not a non-zero power of two"
        ));
    }
    Ok(a)
}

/// Reads the header of a GGUF file of `size` bytes from the start of `r`. Checks that
/// every tensor's data lies inside the file. MXFP4 tensors are checked and left out
/// (`read_header_all` keeps them).
pub fn read_header<R: Read + Seek>(r: &mut R, size: u64) -> Res<Content> {
    read_header_all(r, size).map(|h| h.content)
}

/// `read_header`, with the MXFP4 tensors.
pub fn read_header_all<R: Read + Seek>(r: &mut R, size: u64) -> Res<Header> {
    r.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let mut rd = Reader {
        r,
        pos: 0,
        size,
        v1: false,
        values: 0,
    };
    let magic = rd.array::<4>(&|| "magic".into())?;
    if &magic != b"GGUF" {
        return Err(format!(
            "the file does not start with the GGUF magic (found {:?})",
            String::from_utf8_lossy(&magic)
        ));
    }
    let version = rd.u32(&|| "version".into())?;
    let magic = match version {
        1 => VersionedMagic::GgufV1,
        2 => VersionedMagic::GgufV2,
        3 => VersionedMagic::GgufV3,
        v => return Err(format!("version: unsupported GGUF version {v} (1-3 are)")),
    };
    rd.v1 = version == 1;
    let n_tensors = rd.len(&|| "tensor_count".into())?;
    let n_kv = rd.len(&|| "metadata_kv_count".into())?;
    let per_kv = rd.min_size(8) + 4 + 1;
    let per_tensor = rd.min_size(8) + 4 + 4 + 8;
    if n_kv.saturating_mul(per_kv) > rd.left() {
        return Err(format!(
            "metadata_kv_count: {n_kv} entries cannot fit in the {} bytes left",
            rd.left()
        ));
    }
    if n_tensors.saturating_mul(per_tensor) > rd.left() {
        return Err(format!(
            "tensor_count: {n_tensors} tensors cannot fit in the {} bytes left",
            rd.left()
        ));
    }
    let mut metadata = HashMap::new();
    for i in 0..n_kv {
        let key = rd.string(&|| format!("metadata entry {i}: key"))?;
        let what = |k: &str| format!("metadata '{k}'");
        let ty = rd.u32(&|| what(&key))?;
        let value = rd.value(ty, 0, &|| what(&key))?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(format!("{}: duplicate key", what(&key)));
        }
    }
    let align = alignment(&metadata)?;
    let mut tensor_infos = HashMap::new();
    for i in 0..n_tensors {
        let name = rd.string(&|| format!("tensor {i}: name"))?;
        let what = || format!("tensor '{name}'");
        let n_dims = rd.u32(&what)? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!(
                "{}: {n_dims} dimensions (1-{MAX_DIMS} allowed)",
                what()
            ));
        }
        let mut dims = Vec::with_capacity(n_dims);
        let mut elems: u64 = 1;
        for d in 0..n_dims {
            let n = rd.len(&|| format!("{}: dimension {d}", what()))?;
            elems = elems
                .checked_mul(n)
                .filter(|&e| e <= i64::MAX as u64)
                .ok_or_else(|| format!("{}: element count overflows at dimension {d}", what()))?;
            dims.push(
                usize::try_from(n)
                    .map_err(|_| format!("{}: dimension {d} is too large", what()))?,
            );
        }
        dims.reverse();
        let id = rd.u32(&what)?;
        let dtype = match (id, dtype_from_id(id)) {
            (_, Some(d)) => FileType::Ggml(d),
            (MXFP4_ID, None) => FileType::Mxfp4,
            _ => return Err(format!("{}: unknown tensor type {id}", what())),
        };
        let offset = rd.u64(&what)?;
        if offset % align != 0 {
            return Err(format!(
                "{}: data offset {offset} is not a multiple of the alignment {align}",
                what()
            ));
        }
        let row = dims.last().copied().unwrap_or(1) as u64;
        if !row.is_multiple_of(dtype.block_size() as u64) {
            return Err(format!(
                "{}: rows of {row} elements are not whole {} blocks of {}",
                what(),
                dtype.name(),
                dtype.block_size()
            ));
        }
        let nbytes = dtype
            .nbytes(elems)
            .ok_or_else(|| format!("{}: byte size overflows", what()))?;
        if tensor_infos
            .insert(name.clone(), (dtype, dims, offset, nbytes))
            .is_some()
        {
            return Err(format!("{}: duplicate tensor name", what()));
        }
    }
    let data_offset = rd
        .pos
        .checked_next_multiple_of(align)
        .ok_or_else(|| "tensor data offset overflows".to_string())?;
    let mut infos = HashMap::with_capacity(tensor_infos.len());
    let mut mxfp4 = HashMap::new();
    for (name, (dtype, dims, offset, nbytes)) in tensor_infos {
        let end = data_offset
            .checked_add(offset)
            .and_then(|s| s.checked_add(nbytes));
        match end {
            Some(end) if end <= size => {}
            _ => {
                return Err(format!(
                    "file is truncated: tensor '{name}' ({nbytes} bytes at data offset {offset}) ends past the end of the file ({size} bytes)",
                ))
            }
        }
        match dtype {
            FileType::Ggml(ggml_dtype) => {
                let shape = candle_core::Shape::from(dims);
                infos.insert(
                    name,
                    TensorInfo {
                        ggml_dtype,
                        shape,
                        offset,
                    },
                );
            }
            FileType::Mxfp4 => {
                mxfp4.insert(name, RawTensor { dims, offset });
            }
        }
    }
    Ok(Header {
        content: Content {
            magic,
            metadata,
            tensor_infos: infos,
            tensor_data_offset: data_offset,
        },
        mxfp4,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A version-3 GGUF with no metadata and `tensors` (`name`, GGUF dims (columns
    /// first), type id, data offset), followed by `data` bytes of tensor data.
    fn file(tensors: &[(&str, &[u64], u32, u64)], data: usize) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend(0u64.to_le_bytes());
        for (name, dims, ty, offset) in tensors {
            b.extend((name.len() as u64).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
            b.extend(ty.to_le_bytes());
            b.extend(offset.to_le_bytes());
        }
        b.resize(b.len().next_multiple_of(32) + data, 0);
        b
    }

    fn read(b: &[u8]) -> Res<Header> {
        read_header_all(&mut Cursor::new(b), b.len() as u64)
    }

    /// MXFP4 tensors are kept beside candle's `Content`, sized at 17 bytes a block of
    /// 32, rows checked as whole blocks and data as inside the file.
    #[test]
    fn mxfp4_tensors_are_kept_apart_and_checked() {
        // Two rows of 64 values: 4 blocks, 68 bytes; the F32 vector after, aligned.
        let ok = file(&[("e", &[64, 2], MXFP4_ID, 0), ("v", &[4], 0, 96)], 112);
        let h = read(&ok).unwrap();
        assert_eq!(
            h.mxfp4.get("e"),
            Some(&RawTensor {
                dims: vec![2, 64],
                offset: 0
            })
        );
        assert!(!h.content.tensor_infos.contains_key("e"));
        assert!(h.content.tensor_infos.contains_key("v"));
        assert!(read_header(&mut Cursor::new(&ok), ok.len() as u64).is_ok());
        let e = read(&file(&[("e", &[48, 2], MXFP4_ID, 0)], 64))
            .err()
            .unwrap();
        assert!(e.contains("not whole MXFP4 blocks of 32"), "{e}");
        let e = read(&file(&[("e", &[64, 2], MXFP4_ID, 0)], 67))
            .err()
            .unwrap();
        assert!(e.contains("truncated") && e.contains("68 bytes"), "{e}");
        let e = read(&file(&[("e", &[64, 2], 40, 0)], 68)).err().unwrap();
        assert!(e.contains("unknown tensor type 40"), "{e}");
    }
}
