//! One block file of the disk tier: a header naming what the block is (the KV
//! identity, the cache scope's salt, its chain hash and its parent's, its tokens),
//! the runner's bytes of the block, and a CRC-32 over all of it. A file that is
//! short, long, foreign (another magic, identity or block size) or whose checksum
//! fails is refused with the reason, never used.

use std::io::Read;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"SLOKVB01";
/// Magic, identity, salt, parent, hash, block size (u32), payload length (u64).
const FIXED: usize = 8 + 8 * 4 + 4 + 8;

/// What a block file says about its block (its header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockHeader {
    pub identity: u64,
    pub salt: u64,
    pub parent: u64,
    pub hash: u64,
    pub tokens: Vec<u32>,
    pub payload_len: usize,
}

impl BlockHeader {
    /// Bytes of the header (fixed part and tokens).
    pub fn header_len(block_size: usize) -> usize {
        FIXED + 4 * block_size
    }

    /// Bytes of the whole file: header, payload, checksum.
    pub fn file_len(&self) -> usize {
        Self::header_len(self.tokens.len()) + self.payload_len + 4
    }
}

/// The file name of block `hash`.
pub fn file_name(hash: u64) -> String {
    format!("{hash:016x}.kvb")
}

/// The path of block `hash` in `dir`.
pub fn path_of(dir: &Path, hash: u64) -> PathBuf {
    dir.join(file_name(hash))
}

/// The whole file of a block: header, `payload`, CRC-32 of both.
pub fn encode(h: &BlockHeader, payload: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(BlockHeader::header_len(h.tokens.len()) + payload.len() + 4);
    out.extend_from_slice(MAGIC);
    for v in [h.identity, h.salt, h.parent, h.hash] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(h.tokens.len() as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    for t in &h.tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(out);
    out.extend_from_slice(&crc.to_le_bytes());
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Parses a header from the first bytes of a file, checking it is ours, of
/// `identity` and `block_size`, with `payload_len` bytes of payload.
pub fn parse_header(
    b: &[u8],
    identity: u64,
    block_size: usize,
    payload_len: usize,
) -> Result<BlockHeader, String> {
    if b.len() < FIXED || &b[..8] != MAGIC {
        return Err("not a sloserve KV block file".into());
    }
    let h = BlockHeader {
        identity: u64_at(b, 8),
        salt: u64_at(b, 16),
        parent: u64_at(b, 24),
        hash: u64_at(b, 32),
        tokens: Vec::new(),
        payload_len: u64_at(b, 44) as usize,
    };
    let bs = u32::from_le_bytes(b[40..44].try_into().expect("4 bytes")) as usize;
    if h.identity != identity {
        return Err(format!(
            "written for KV identity {:016x}, not {identity:016x}",
            h.identity
        ));
    }
    if bs != block_size || h.payload_len != payload_len {
        return Err(format!(
            "block of {bs} tokens and {} bytes, expected {block_size} and {payload_len}",
            h.payload_len
        ));
    }
    if b.len() < BlockHeader::header_len(bs) {
        return Err("truncated header".into());
    }
    let tokens = b[FIXED..FIXED + 4 * bs]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    Ok(BlockHeader { tokens, ..h })
}

/// Reads a header from `path`, also checking the file's length against it.
pub fn read_header(
    path: &Path,
    identity: u64,
    block_size: usize,
    payload_len: usize,
) -> Result<BlockHeader, String> {
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len() as usize;
    let mut b = vec![0u8; BlockHeader::header_len(block_size).min(len)];
    f.read_exact(&mut b).map_err(|e| e.to_string())?;
    let h = parse_header(&b, identity, block_size, payload_len)?;
    if len != h.file_len() {
        return Err(format!(
            "{len} bytes, expected {} (torn write?)",
            h.file_len()
        ));
    }
    Ok(h)
}

/// Reads the whole file of a block into `buf` and checks it: ours, of
/// `identity`, the expected salt, hash, parent and tokens, the checksum right.
/// On success the payload is `buf[payload_range(block_size)]`.
pub fn read_block(
    path: &Path,
    expect: &BlockHeader,
    block_size: usize,
    buf: &mut Vec<u8>,
) -> Result<std::ops::Range<usize>, String> {
    buf.clear();
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    f.read_to_end(buf).map_err(|e| e.to_string())?;
    let h = parse_header(buf, expect.identity, block_size, expect.payload_len)?;
    if buf.len() != h.file_len() {
        return Err(format!(
            "{} bytes, expected {} (torn write?)",
            buf.len(),
            h.file_len()
        ));
    }
    let body = buf.len() - 4;
    let crc = u32::from_le_bytes(buf[body..].try_into().expect("4 bytes"));
    if crc32fast::hash(&buf[..body]) != crc {
        return Err("checksum mismatch (damaged file)".into());
    }
    if (h.salt, h.hash, h.parent) != (expect.salt, expect.hash, expect.parent)
        || h.tokens != expect.tokens
    {
        return Err("holds another block than its name says".into());
    }
    let start = BlockHeader::header_len(block_size);
    Ok(start..start + h.payload_len)
}
