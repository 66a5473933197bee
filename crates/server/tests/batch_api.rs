//! The Batch API's HTTP edges on the real server: upload limits and fields, unknown
//! ids, a file in use, a batch that runs to the end and its metrics, and a restart
//! on the same --data-dir that keeps files and batches.

mod common;

use common::batch::*;
use common::*;
use serde_json::Value;

fn line(id: &str) -> String {
    format!(
        r#"{{"custom_id":"{id}","method":"POST","url":"/v1/completions","body":{{"prompt":"Hello","max_tokens":2,"temperature":0}}}}"#
    )
}

#[test]
fn uploads_are_checked_and_batches_run_and_survive_a_restart() {
    let mut args = test_args();
    args.batch.max_batch_file_bytes = 4096;
    let data_dir = args.batch.data_dir.clone();
    let srv = TestServer::start(args.clone());
    // Limits and fields.
    upload(&srv, Some("batch"), Some(&[b'x'; 5000])).openai_error(413);
    let e = upload(&srv, Some("fine-tune"), Some(b"{}")).openai_error(400);
    assert_eq!(e["param"], "purpose");
    assert_eq!(
        upload(&srv, Some("batch"), None).openai_error(400)["param"],
        "file"
    );
    // The upload takes multipart only (a JSON body is refused before it is read).
    let r = request(srv.addr, "POST", "/v1/files", &[], b"{}");
    assert_eq!(r.openai_error(415)["code"], "unsupported_media_type");
    request(srv.addr, "GET", "/v1/files/file-nope", &[], b"").openai_error(404);
    request(srv.addr, "GET", "/v1/batches/batch_nope", &[], b"").openai_error(404);
    request(srv.addr, "POST", "/v1/batches/batch_nope/cancel", &[], b"").openai_error(404);
    let e = request(srv.addr, "GET", "/v1/batches?limit=0", &[], b"").openai_error(400);
    assert_eq!(e["param"], "limit");
    let e = request(
        srv.addr,
        "POST",
        "/v1/batches",
        &[],
        br#"{"input_file_id":"file-nope","endpoint":"/v1/completions","completion_window":"24h"}"#,
    )
    .openai_error(404);
    assert!(e["message"].as_str().unwrap().contains("file-nope"), "{e}");
    // A small batch runs to the end.
    let text = format!("{}\n{}\n", line("a"), line("b"));
    let f = upload(&srv, Some("batch"), Some(text.as_bytes()));
    assert_eq!(f.status, 200, "{}", f.text());
    let fid = f.json()["id"].as_str().unwrap().to_string();
    let create = format!(
        r#"{{"input_file_id":"{fid}","endpoint":"/v1/completions","completion_window":"24h"}}"#
    );
    let b = request(srv.addr, "POST", "/v1/batches", &[], create.as_bytes()).json();
    let bid = b["id"].as_str().unwrap().to_string();
    let mut done = Value::Null;
    for _ in 0..600 {
        done = request(srv.addr, "GET", &format!("/v1/batches/{bid}"), &[], b"").json();
        if done["status"] == "completed" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["request_counts"]["completed"], 2);
    assert!(
        done["sloserve"]["machine_seconds"].as_f64().unwrap() > 0.0,
        "{done}"
    );
    let metrics = request(srv.addr, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.contains("sloserve:batch_requests_total{status=\"completed\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("sloserve:batch_jobs{status=\"completed\"} 1"));
    // Restart on the same directory: the batch and its output are still there.
    srv.shutdown();
    srv.wait(std::time::Duration::from_secs(60)).unwrap();
    let srv = TestServer::start(args);
    let again = request(srv.addr, "GET", &format!("/v1/batches/{bid}"), &[], b"").json();
    assert_eq!(again["status"], "completed");
    let out = request(
        srv.addr,
        "GET",
        &format!(
            "/v1/files/{}/content",
            again["output_file_id"].as_str().unwrap()
        ),
        &[],
        b"",
    );
    let ids: Vec<String> = out
        .text()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["custom_id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(ids, ["a", "b"]);
    let del = request(srv.addr, "DELETE", &format!("/v1/files/{fid}"), &[], b"").json();
    assert_eq!(del["deleted"], true);
    srv.shutdown();
    let _ = std::fs::remove_dir_all(data_dir);
}

/// Batch lines on `/v1/responses`: answered by the Responses handler (a response
/// object, a json_schema `text.format` honoured), its usage counted in the batch's,
/// and its refusals (a stateful field) in the error file.
#[test]
fn batch_lines_run_on_the_responses_api() {
    let args = test_args();
    let data_dir = args.batch.data_dir.clone();
    let srv = TestServer::start(args);
    let schema = r#"{"type":"object","properties":{"mood":{"enum":["happy","sad"]}},"required":["mood"],"additionalProperties":false}"#;
    let lines = [
        r#"{"custom_id":"plain","method":"POST","url":"/v1/responses","body":{"input":"Say hello.","max_output_tokens":4,"temperature":0}}"#.to_string(),
        format!(
            r#"{{"custom_id":"json","method":"POST","url":"/v1/responses","body":{{"input":[{{"role":"user","content":"How do you feel?"}}],"text":{{"format":{{"type":"json_schema","name":"feeling","schema":{schema},"strict":true}}}},"max_output_tokens":32,"temperature":0}}}}"#
        ),
        r#"{"custom_id":"stateful","method":"POST","url":"/v1/responses","body":{"input":"Again.","previous_response_id":"resp_1"}}"#.to_string(),
    ];
    let done = run_batch(&srv, "/v1/responses", &lines);
    assert_eq!(done["endpoint"], "/v1/responses");
    assert_eq!(done["request_counts"]["completed"], 2, "{done}");
    assert_eq!(done["request_counts"]["failed"], 1, "{done}");
    let usage = &done["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 0, "{done}");
    assert!(usage["output_tokens"].as_u64().unwrap() > 0, "{done}");
    let out = file_lines(&srv, &done["output_file_id"]);
    assert_eq!(out.len(), 2);
    for l in &out {
        let body = &l["response"]["body"];
        assert_eq!(l["response"]["status_code"], 200, "{l}");
        assert_eq!(body["object"], "response", "{l}");
        assert!(body["usage"]["output_tokens"].as_u64().unwrap() > 0, "{l}");
        if l["custom_id"] == "json" {
            let text = body["output"][0]["content"][0]["text"].as_str().unwrap();
            let v: Value = serde_json::from_str(text).expect("the schema's JSON");
            assert!(v["mood"] == "happy" || v["mood"] == "sad", "{text}");
        }
    }
    let errors = file_lines(&srv, &done["error_file_id"]);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["custom_id"], "stateful");
    assert_eq!(errors[0]["response"]["status_code"], 400, "{}", errors[0]);
    srv.shutdown();
    let _ = std::fs::remove_dir_all(data_dir);
}
