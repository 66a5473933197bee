//! Hostile GGUF files: each malformed header field gives an error naming the file and
//! the field, never a panic, an abort or a huge allocation. The files are written
//! byte by byte (`Gguf` below) so that any one field can be set to a bad value; every
//! prefix and many one-byte corruptions of a valid file are loaded too.

mod common;

use std::path::{Path, PathBuf};

use sloserve_model::{LlamaRunner, RunnerOptions};

const H: u64 = 8;
const HEADS: u64 = 2;
const HD: u64 = 4;
const FFN: u64 = 16;
const VOCAB: u64 = 16;

const T_U32: u32 = 4;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;

fn le32(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}
fn le64(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}
fn string(s: &str) -> Vec<u8> {
    let mut b = le64(s.len() as u64);
    b.extend_from_slice(s.as_bytes());
    b
}

struct Tensor {
    name: String,
    /// GGUF order: the row length first.
    dims: Vec<u64>,
    dtype: u32,
    offset: Option<u64>,
    nbytes: u64,
}

/// A GGUF file as fields; `bytes` writes it, with overrides for the counts.
struct Gguf {
    magic: [u8; 4],
    version: u32,
    tensor_count: Option<u64>,
    kv_count: Option<u64>,
    kvs: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<Tensor>,
    truncate_data: u64,
}

impl Gguf {
    /// A valid one-layer llama model with f32 weights and a byte-level vocabulary.
    fn valid() -> Gguf {
        let mut g = Gguf {
            magic: *b"GGUF",
            version: 3,
            tensor_count: None,
            kv_count: None,
            kvs: Vec::new(),
            tensors: Vec::new(),
            truncate_data: 0,
        };
        g.kv("general.architecture", T_STRING, string("llama"));
        for (k, v) in [
            ("embedding_length", H),
            ("feed_forward_length", FFN),
            ("block_count", 1),
            ("attention.head_count", HEADS),
            ("attention.head_count_kv", 1),
            ("context_length", 64),
        ] {
            g.kv(&format!("llama.{k}"), T_U32, le32(v as u32));
        }
        g.kv(
            "llama.attention.layer_norm_rms_epsilon",
            T_F32,
            1e-5f32.to_le_bytes().to_vec(),
        );
        let mut tokens = le32(T_STRING);
        tokens.extend(le64(VOCAB));
        for i in 0..VOCAB {
            tokens.extend(string(&format!("t{i}")));
        }
        g.kv("tokenizer.ggml.tokens", T_ARRAY, tokens);
        let (q, kv) = (HEADS * HD, HD);
        for (name, dims) in [
            ("token_embd.weight", vec![H, VOCAB]),
            ("output_norm.weight", vec![H]),
            ("blk.0.attn_norm.weight", vec![H]),
            ("blk.0.ffn_norm.weight", vec![H]),
            ("blk.0.attn_q.weight", vec![H, q]),
            ("blk.0.attn_k.weight", vec![H, kv]),
            ("blk.0.attn_v.weight", vec![H, kv]),
            ("blk.0.attn_output.weight", vec![q, H]),
            ("blk.0.ffn_gate.weight", vec![H, FFN]),
            ("blk.0.ffn_up.weight", vec![H, FFN]),
            ("blk.0.ffn_down.weight", vec![FFN, H]),
        ] {
            let nbytes = dims.iter().product::<u64>() * 4;
            g.tensors.push(Tensor {
                name: name.into(),
                dims,
                dtype: 0,
                offset: None,
                nbytes,
            });
        }
        g
    }

    fn kv(&mut self, key: &str, ty: u32, payload: Vec<u8>) {
        self.kvs.retain(|(k, _, _)| k != key);
        self.kvs.push((key.into(), ty, payload));
    }

    fn tensor(&mut self, name: &str) -> &mut Tensor {
        self.tensors.iter_mut().find(|t| t.name == name).unwrap()
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = self.magic.to_vec();
        b.extend(le32(self.version));
        b.extend(le64(self.tensor_count.unwrap_or(self.tensors.len() as u64)));
        b.extend(le64(self.kv_count.unwrap_or(self.kvs.len() as u64)));
        for (k, ty, payload) in &self.kvs {
            b.extend(string(k));
            b.extend(le32(*ty));
            b.extend(payload);
        }
        let mut next = 0u64;
        let mut data_len = 0u64;
        for t in &self.tensors {
            b.extend(string(&t.name));
            b.extend(le32(t.dims.len() as u32));
            for &d in &t.dims {
                b.extend(le64(d));
            }
            b.extend(le32(t.dtype));
            b.extend(le64(t.offset.unwrap_or(next)));
            next += t.nbytes.next_multiple_of(32);
            data_len = data_len.max(next);
        }
        b.resize(b.len().next_multiple_of(32), 0);
        let data: Vec<u8> = (0..data_len - self.truncate_data)
            .map(|i| [0x00, 0x00, 0x80, 0x3c][i as usize % 4]) // f32 1/64
            .collect();
        b.extend(data);
        b
    }
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("sloserve-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn opts() -> RunnerOptions {
    RunnerOptions {
        kv_cache_memory: Some(1 << 20),
        ..Default::default()
    }
}

fn load_bytes(path: &Path, bytes: &[u8]) -> Result<LlamaRunner, String> {
    std::fs::write(path, bytes).unwrap();
    LlamaRunner::load(path, &opts()).map_err(|e| e.to_string())
}

/// Loads `g` as `name`; the error must name the file and contain every one of `want`.
fn expect_err(name: &str, g: &Gguf, want: &[&str]) {
    let path = dir().join(format!("{name}.gguf"));
    match load_bytes(&path, &g.bytes()) {
        Ok(_) => panic!("{name}: loaded but should not"),
        Err(e) => {
            assert!(e.contains(&format!("{name}.gguf")), "{name}: {e}");
            for w in want {
                assert!(e.contains(w), "{name}: wanted {w:?} in: {e}");
            }
        }
    }
}

#[test]
fn the_valid_file_loads() {
    let path = dir().join("valid.gguf");
    let r = load_bytes(&path, &Gguf::valid().bytes()).expect("valid file loads");
    assert_eq!(r.model().config.vocab_size, VOCAB as usize);
}

/// A KV cache that cannot fit beside the weights is refused before anything is
/// allocated, with the sizes and what to lower.
#[test]
fn a_kv_cache_past_the_machines_memory_is_refused_at_load() {
    let path = dir().join("too-big.gguf");
    std::fs::write(&path, Gguf::valid().bytes()).unwrap();
    let opts = RunnerOptions {
        kv_cache_memory: Some(usize::MAX / 4),
        ..Default::default()
    };
    let e = LlamaRunner::load(&path, &opts)
        .err()
        .expect("refused")
        .to_string();
    for want in [
        "too-big.gguf",
        "does not fit in memory",
        "--kv-cache-memory",
        "available",
    ] {
        assert!(e.contains(want), "wanted {want:?} in: {e}");
    }
}

#[test]
fn each_malformed_header_field_is_a_clear_error() {
    let mut cases: Vec<(&str, Gguf, Vec<&str>)> = Vec::new();
    let mut add = |name, f: &dyn Fn(&mut Gguf), want: &[&'static str]| {
        let mut g = Gguf::valid();
        f(&mut g);
        cases.push((name, g, want.to_vec()));
    };
    add("magic", &|g| g.magic = *b"GGML", &["GGUF magic"]);
    add("version", &|g| g.version = 99, &["version", "99"]);
    add(
        "tensor-count",
        &|g| g.tensor_count = Some(u64::MAX),
        &["tensor_count"],
    );
    add(
        "kv-count",
        &|g| g.kv_count = Some(1 << 40),
        &["metadata_kv_count"],
    );
    add(
        "string-len",
        &|g| g.kv("general.architecture", T_STRING, le64(u64::MAX - 3)),
        &["metadata 'general.architecture'", "bytes"],
    );
    add(
        "array-len",
        &|g| {
            let mut a = le32(T_U32);
            a.extend(le64(1 << 62));
            g.kv("tokenizer.ggml.tokens", T_ARRAY, a)
        },
        &[
            "metadata 'tokenizer.ggml.tokens'",
            "array of 4611686018427387904",
        ],
    );
    add(
        "value-type",
        &|g| g.kv("x.y", 77, vec![0; 8]),
        &["metadata 'x.y'", "unknown value type 77"],
    );
    add(
        "bool",
        &|g| g.kv("x.flag", T_BOOL, vec![7]),
        &["metadata 'x.flag'", "bool value 7"],
    );
    add(
        "nesting",
        &|g| {
            let mut a = Vec::new();
            for _ in 0..6 {
                a.extend(le32(T_ARRAY));
                a.extend(le64(1));
            }
            a.extend(le32(T_U32));
            a.extend(le64(0));
            g.kv("x.nest", T_ARRAY, a)
        },
        &["metadata 'x.nest'", "nested deeper"],
    );
    add(
        "alignment-zero",
        &|g| g.kv("general.alignment", T_U32, le32(0)),
        &["general.alignment", "alignment 0"],
    );
    add(
        "alignment-odd",
        &|g| g.kv("general.alignment", T_U32, le32(48)),
        &["general.alignment", "48"],
    );
    add(
        "alignment-type",
        &|g| g.kv("general.alignment", T_STRING, string("32")),
        &["general.alignment", "expected an integer"],
    );
    add(
        "no-dims",
        &|g| g.tensor("output_norm.weight").dims = vec![],
        &["tensor 'output_norm.weight'", "0 dimensions"],
    );
    add(
        "many-dims",
        &|g| g.tensor("output_norm.weight").dims = vec![1; 9],
        &["tensor 'output_norm.weight'", "9 dimensions"],
    );
    add(
        "dims-overflow",
        &|g| g.tensor("blk.0.attn_q.weight").dims = vec![1 << 40, 1 << 40],
        &["tensor 'blk.0.attn_q.weight'", "overflows"],
    );
    add(
        "dtype",
        &|g| g.tensor("output_norm.weight").dtype = 99,
        &["tensor 'output_norm.weight'", "unknown tensor type 99"],
    );
    add(
        "partial-block",
        &|g| {
            let t = g.tensor("output_norm.weight");
            t.dtype = 8; // Q8_0: blocks of 32
            t.dims = vec![33];
        },
        &["tensor 'output_norm.weight'", "not whole Q8_0 blocks"],
    );
    add(
        "offset-unaligned",
        &|g| g.tensor("output_norm.weight").offset = Some(4),
        &["tensor 'output_norm.weight'", "alignment"],
    );
    add(
        "offset-huge",
        &|g| g.tensor("output_norm.weight").offset = Some(!31),
        &["truncated", "output_norm.weight"],
    );
    add("data-truncated", &|g| g.truncate_data = 64, &["truncated"]);
    add(
        "duplicate-key",
        &|g| {
            g.kvs.push(("llama.block_count".into(), T_U32, le32(1)));
        },
        &["metadata 'llama.block_count'", "duplicate"],
    );
    add(
        "duplicate-tensor",
        &|g| {
            g.tensors.push(Tensor {
                name: "output_norm.weight".into(),
                dims: vec![H],
                dtype: 0,
                offset: None,
                nbytes: H * 4,
            })
        },
        &["tensor 'output_norm.weight'", "duplicate"],
    );
    add(
        "zero-embedding",
        &|g| g.tensor("token_embd.weight").dims = vec![H, 0],
        &["token_embd.weight", "zero-sized"],
    );
    add(
        "block-count",
        &|g| g.kv("llama.block_count", T_U64, le64(u64::MAX / 2)),
        &["llama.block_count", "overflows"],
    );
    add(
        "head-count",
        &|g| {
            g.kv("llama.attention.head_count", T_U64, le64(1 << 62));
            g.kv("llama.attention.head_count_kv", T_U64, le64(1 << 62));
            g.kv("llama.attention.key_length", T_U32, le32(8));
        },
        &["llama.attention.head_count", "overflows"],
    );
    assert!(cases.len() >= 25);
    for (name, g, want) in &cases {
        expect_err(name, g, want);
    }
}

/// The RoPE table follows the served context (and the KV pool), not the file's claim.
#[test]
fn rope_table_is_sized_by_the_served_context() {
    let mut g = Gguf::valid();
    g.kv("llama.context_length", T_U64, le64(1 << 60));
    let path = dir().join("huge-context.gguf");
    std::fs::write(&path, g.bytes()).unwrap();
    let served = RunnerOptions {
        max_model_len: Some(100),
        ..opts()
    };
    let r = LlamaRunner::load(&path, &served).unwrap();
    assert_eq!(r.model().rope_positions(), 100);
    // Unbounded: the KV pool (1 MiB) bounds it.
    let r = LlamaRunner::load(&path, &opts()).unwrap();
    use sloserve_engine::ModelRunner;
    let info = r.info();
    assert_eq!(
        r.model().rope_positions(),
        info.num_kv_blocks * info.block_size
    );
}

/// Every prefix of a valid file, and the file with each header byte replaced, loads or
/// fails cleanly.
#[test]
fn truncations_and_byte_corruptions_never_panic() {
    let good = Gguf::valid().bytes();
    let path = dir().join("corrupt.gguf");
    for len in 0..good.len() {
        let e = load_bytes(&path, &good[..len]).err();
        assert!(
            e.is_some_and(|e| e.contains("corrupt.gguf")),
            "prefix {len}"
        );
    }
    let header_len = good.len()
        - Gguf::valid()
            .tensors
            .iter()
            .map(|t| t.nbytes.next_multiple_of(32))
            .sum::<u64>() as usize;
    for i in 0..header_len {
        for v in [0x00, 0xff, 0x7f, 0x80] {
            let mut b = good.clone();
            b[i] = v;
            let _ = load_bytes(&path, &b);
        }
    }
}

/// Writes the synthetic files into the GGUF fuzz target's seed corpus:
/// `cargo test -p sloserve-model --test hostile_gguf -- --ignored write_fuzz_seeds`.
#[test]
#[ignore]
fn write_fuzz_seeds() {
    let out = common::repo_root().join("fuzz/corpus/gguf_header");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("seed-synthetic-llama.gguf"), Gguf::valid().bytes()).unwrap();
    let mut g = Gguf::valid();
    g.version = 2;
    g.kv("general.alignment", T_U32, le32(32));
    std::fs::write(out.join("seed-synthetic-v2.gguf"), g.bytes()).unwrap();
    let model = std::fs::read(common::model_path()).unwrap();
    std::fs::write(out.join("seed-smollm2-prefix-4k.gguf"), &model[..4096]).unwrap();
}

/// A FIFO (or a directory) named as the model is refused at once, naming the file
/// and what it is: opening a FIFO would wait for a writer forever.
#[test]
fn a_path_that_is_not_a_regular_file_is_refused_at_once() {
    let fifo = dir().join("model.fifo");
    let _ = std::fs::remove_file(&fifo);
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    for (path, kind) in [(fifo, "a FIFO"), (dir(), "a directory")] {
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            let _ = tx.send(
                LlamaRunner::load(&p, &opts())
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
            );
        });
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{}: loading hangs", path.display()));
        let e = r.expect_err("not a model");
        assert!(
            e.contains(&path.display().to_string()) && e.contains(kind),
            "{e}"
        );
        assert!(e.contains("not a regular file"), "{e}");
    }
}
