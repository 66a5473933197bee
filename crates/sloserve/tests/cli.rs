//! The `sloserve` binary end to end: `generate` streams the reference continuation
//! and a timing line, `inspect` describes the model (and names an encoder's
//! family), bad files give clear errors.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model() -> PathBuf {
    let p = root().join(sloserve_model::DEFAULT_MODEL_PATH);
    assert!(
        p.exists(),
        "{} is missing: run `make model` first",
        p.display()
    );
    p
}

fn sloserve(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sloserve"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn generate_exact_greedy_prints_the_reference_continuation_and_timings() {
    let m = model();
    // First record of the exact reference: 32 greedy tokens of this prompt.
    let (ok, out, err) = sloserve(&[
        "generate",
        "--model",
        m.to_str().unwrap(),
        "--precision",
        "exact",
        "--prompt",
        "Once upon a time, there was a little",
        "--max-tokens",
        "32",
        // One compute thread: the same exact output as with one per core.
        "--threads",
        "1",
    ]);
    assert!(ok, "{err}");
    let expected = " girl named Emma who loved to play in the sun. She would often go to the beach and play with her friends. One day, she decided to go to";
    assert_eq!(out.trim_end_matches('\n'), expected);
    assert!(
        err.contains("prompt tokens 9") && err.contains("TTFT") && err.contains("decode"),
        "{err}"
    );
}

#[test]
fn generate_chat_stops_at_end_of_turn_and_seeded_sampling_repeats() {
    let m = model();
    let args = [
        "generate",
        "--model",
        m.to_str().unwrap(),
        "--chat",
        "Say hello.",
        "--max-tokens",
        "24",
        "--temperature",
        "0.9",
        "--top-p",
        "0.95",
        "--seed",
        "7",
    ];
    let (ok1, out1, err1) = sloserve(&args);
    let (ok2, out2, _) = sloserve(&args);
    assert!(ok1 && ok2, "{err1}");
    assert!(!out1.trim().is_empty());
    assert!(
        !out1.contains("<|im_end|>"),
        "the end-of-turn token is not printed: {out1}"
    );
    assert_eq!(out1, out2, "same seed, same text");
    // Another seed samples another text (greedy decoding would not).
    let mut other = args;
    other[args.len() - 1] = "8";
    let (ok3, out3, err3) = sloserve(&other);
    assert!(ok3, "{err3}");
    assert_ne!(out1, out3, "seeds 7 and 8 gave the same text");
}

#[test]
fn inspect_describes_the_default_model() {
    let m = model();
    let (ok, out, err) = sloserve(&["inspect", "--model", m.to_str().unwrap()]);
    assert!(ok, "{err}");
    for needle in [
        "architecture:    llama",
        "layers:          30",
        "Q4_1",
        "Q8_0",
        "context length:  8192",
        "<|im_end|>",
        "chat template:",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
}

#[test]
fn inspect_names_the_encoder_family_of_minilm() {
    let m = root().join("models/all-MiniLM-L6-v2.F16.gguf");
    assert!(m.exists(), "{}: run `make model-minilm`", m.display());
    let (ok, out, err) = sloserve(&["inspect", "--model", m.to_str().unwrap()]);
    assert!(ok, "{err}");
    for needle in [
        "architecture:    bert",
        "family:          bert: a bidirectional encoder",
        "pooling:         mean",
        "positions:       learned",
        "context length:  512",
        "supported:       yes",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    assert!(!out.contains("rope:"), "an encoder has no RoPE:\n{out}");
}

#[test]
fn bad_model_file_is_a_clear_error() {
    let bad = std::env::temp_dir().join(format!("sloserve-cli-bad-{}.gguf", std::process::id()));
    std::fs::write(&bad, b"not a model").unwrap();
    let (ok, _, err) = sloserve(&[
        "generate",
        "--model",
        bad.to_str().unwrap(),
        "--prompt",
        "hi",
    ]);
    assert!(!ok);
    assert!(
        err.contains(bad.to_str().unwrap()) && err.contains("GGUF"),
        "{err}"
    );
    let (ok, _, err) = sloserve(&[
        "generate",
        "--model",
        "/nonexistent/model.gguf",
        "--prompt",
        "hi",
    ]);
    assert!(!ok && err.contains("/nonexistent/model.gguf"), "{err}");
}

#[test]
fn route_rejects_bad_fleets_and_config_files_clearly() {
    let (ok, _, err) = sloserve(&["route", "--fleet", "interactive"]);
    assert!(!ok && err.contains("NAME=URL"), "{err}");
    let (ok, _, err) = sloserve(&["route", "--fleet", "batch=https://a:1"]);
    assert!(!ok && err.contains("only http://"), "{err}");
    let (ok, _, err) = sloserve(&["route"]);
    assert!(!ok && err.contains("no fleets"), "{err}");
    let (ok, _, err) = sloserve(&["route", "--config", "/nonexistent/router.toml"]);
    assert!(!ok && err.contains("/nonexistent/router.toml"), "{err}");
}
