//! The Batch API from a test: upload a JSONL file, run a batch to its end,
//! read a result file.

use serde_json::Value;

use super::{request, Resp, TestServer};

pub fn multipart(purpose: Option<&str>, file: Option<&[u8]>) -> (String, Vec<u8>) {
    let b = "XbatchX";
    let mut body = Vec::new();
    if let Some(p) = purpose {
        body.extend(
            format!("--{b}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{p}\r\n")
                .bytes(),
        );
    }
    if let Some(f) = file {
        body.extend(format!("--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n").bytes());
        body.extend_from_slice(f);
        body.extend(b"\r\n");
    }
    body.extend(format!("--{b}--\r\n").bytes());
    (format!("multipart/form-data; boundary={b}"), body)
}

pub fn upload(srv: &TestServer, purpose: Option<&str>, file: Option<&[u8]>) -> Resp {
    let (ct, body) = multipart(purpose, file);
    request(
        srv.addr,
        "POST",
        "/v1/files",
        &[("Content-Type", &ct)],
        &body,
    )
}

/// Runs `lines` as a batch on `endpoint` to its end; the finished batch object.
pub fn run_batch(srv: &TestServer, endpoint: &str, lines: &[String]) -> Value {
    let text = lines.join("\n") + "\n";
    let f = upload(srv, Some("batch"), Some(text.as_bytes()));
    assert_eq!(f.status, 200, "{}", f.text());
    let fid = f.json()["id"].as_str().unwrap().to_string();
    let create =
        format!(r#"{{"input_file_id":"{fid}","endpoint":"{endpoint}","completion_window":"24h"}}"#);
    let b = request(srv.addr, "POST", "/v1/batches", &[], create.as_bytes()).json();
    let bid = b["id"].as_str().expect("a batch id").to_string();
    for _ in 0..600 {
        let done = request(srv.addr, "GET", &format!("/v1/batches/{bid}"), &[], b"").json();
        if done["status"] == "completed" {
            return done;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("batch {bid} did not complete");
}

pub fn file_lines(srv: &TestServer, id: &Value) -> Vec<Value> {
    let path = format!("/v1/files/{}/content", id.as_str().expect("a file id"));
    request(srv.addr, "GET", &path, &[], b"")
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
