//! Reading and checking a batch input file: JSONL lines `{custom_id, method, url,
//! body}`, unique `custom_id`s, the batch's endpoint, POST only. A file that fails
//! here runs nothing; a body the endpoint refuses is the endpoint's business.

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;

use crate::reader::{read_lines, LineTooLong};
use crate::types::{batch_urls_text, is_batch_url, BatchError, InputLine};

/// Most validation errors reported for one file.
const MAX_ERRORS: usize = 100;

/// A line that passed validation (`line`: its 1-based number in the file).
#[derive(Debug, Clone)]
pub struct ParsedLine {
    pub line: u64,
    pub custom_id: String,
    pub url: String,
    pub body: Value,
}

/// What a valid file holds.
#[derive(Debug, Clone, PartialEq)]
pub struct FileSummary {
    pub total: u64,
    /// The `model` of the first body that names one.
    pub model: Option<String>,
}

fn err(code: &str, line: Option<u64>, param: Option<&str>, message: String) -> BatchError {
    BatchError {
        code: code.into(),
        message,
        param: param.map(Into::into),
        line,
    }
}

/// Parses line `line` of a file; `endpoint`: the batch's (None: either endpoint).
pub fn parse_line(line: u64, text: &str, endpoint: Option<&str>) -> Result<ParsedLine, BatchError> {
    let parsed: InputLine = serde_json::from_str(text).map_err(|e| {
        err(
            "invalid_json_line",
            Some(line),
            None,
            format!("line {line}: not a JSON object with custom_id, method, url and body: {e}"),
        )
    })?;
    if parsed.method != "POST" {
        return Err(err(
            "invalid_method",
            Some(line),
            Some("method"),
            format!("line {line}: method must be POST, got {:?}", parsed.method),
        ));
    }
    let url_ok = match endpoint {
        Some(e) => parsed.url == e,
        None => is_batch_url(&parsed.url),
    };
    if !url_ok {
        let want = endpoint.map_or_else(batch_urls_text, str::to_string);
        return Err(err(
            "invalid_url",
            Some(line),
            Some("url"),
            format!(
                "line {line}: url must be {want} (the batch's endpoint), got {:?}",
                parsed.url
            ),
        ));
    }
    if !parsed.body.is_object() {
        return Err(err(
            "invalid_json_line",
            Some(line),
            Some("body"),
            format!("line {line}: body must be a JSON object"),
        ));
    }
    Ok(ParsedLine {
        line,
        custom_id: parsed.custom_id,
        url: parsed.url,
        body: parsed.body,
    })
}

/// Checks the whole file: every line parses and is at most `max_line_bytes`
/// long (the synchronous endpoints' `--max-body-bytes`), `custom_id`s are
/// unique, at most `max_lines` lines. Returns the summary, or every error found
/// (up to 100).
pub fn validate_file(
    path: &Path,
    endpoint: Option<&str>,
    max_lines: u64,
    max_line_bytes: usize,
) -> Result<FileSummary, Vec<BatchError>> {
    let io = |e: std::io::Error| {
        vec![err(
            "invalid_file",
            None,
            None,
            format!("cannot read the input file: {e}"),
        )]
    };
    let mut seen = HashSet::new();
    let mut errors = Vec::new();
    let mut summary = FileSummary {
        total: 0,
        model: None,
    };
    for item in read_lines(path, max_line_bytes).map_err(io)? {
        let (line, text) = match item {
            Ok(l) => l,
            Err(e) => {
                let too_long = LineTooLong::of(&e);
                errors.push(match (too_long, e.kind()) {
                    (Some(t), _) => err(
                        "line_too_large",
                        Some(t.line),
                        None,
                        format!("{t} (the request body limit, --max-body-bytes)"),
                    ),
                    (None, std::io::ErrorKind::InvalidData) => {
                        err("invalid_json_line", None, None, format!("{e}"))
                    }
                    _ => return Err(io(e)),
                });
                if too_long.is_none() || errors.len() >= MAX_ERRORS {
                    break;
                }
                summary.total += 1;
                continue;
            }
        };
        summary.total += 1;
        if summary.total > max_lines {
            errors.push(err(
                "too_many_tasks",
                Some(line),
                None,
                format!("the input file has more than {max_lines} requests"),
            ));
            break;
        }
        match parse_line(line, &text, endpoint) {
            Ok(p) => {
                if !seen.insert(p.custom_id.clone()) {
                    errors.push(err(
                        "duplicate_custom_id",
                        Some(line),
                        Some("custom_id"),
                        format!(
                            "line {line}: custom_id {:?} appears more than once",
                            p.custom_id
                        ),
                    ));
                }
                if summary.model.is_none() {
                    summary.model = p.body.get("model").and_then(Value::as_str).map(Into::into);
                }
            }
            Err(e) => errors.push(e),
        }
        if errors.len() >= MAX_ERRORS {
            break;
        }
    }
    if summary.total == 0 && errors.is_empty() {
        errors.push(err(
            "empty_file",
            None,
            None,
            "the input file has no requests".into(),
        ));
    }
    if errors.is_empty() {
        Ok(summary)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn line(id: &str, url: &str) -> String {
        format!(
            r#"{{"custom_id":"{id}","method":"POST","url":"{url}","body":{{"model":"m","prompt":"hi"}}}}"#
        )
    }

    #[test]
    fn a_good_file_is_counted_and_names_its_model() {
        let f = file(&format!(
            "{}\n\n{}\n",
            line("a", "/v1/completions"),
            line("b", "/v1/completions")
        ));
        let s = validate_file(f.path(), Some("/v1/completions"), 10, 1 << 20).unwrap();
        assert_eq!(
            s,
            FileSummary {
                total: 2,
                model: Some("m".into())
            }
        );
    }

    #[test]
    fn errors_carry_line_numbers() {
        let text = [
            line("a", "/v1/completions"),
            line("a", "/v1/completions"),
            line("b", "/v1/chat/completions"),
            "not json".to_string(),
            line("c", "/v1/completions").replace("POST", "GET"),
        ]
        .join("\n");
        let errs =
            validate_file(file(&text).path(), Some("/v1/completions"), 10, 1 << 20).unwrap_err();
        let got: Vec<(&str, Option<u64>)> =
            errs.iter().map(|e| (e.code.as_str(), e.line)).collect();
        assert_eq!(
            got,
            [
                ("duplicate_custom_id", Some(2)),
                ("invalid_url", Some(3)),
                ("invalid_json_line", Some(4)),
                ("invalid_method", Some(5)),
            ]
        );
    }

    #[test]
    fn empty_and_oversized_files_fail() {
        let e = validate_file(file("\n\n").path(), None, 10, 1 << 20).unwrap_err();
        assert_eq!(e[0].code, "empty_file");
        let text = (0..3)
            .map(|i| line(&i.to_string(), "/v1/completions"))
            .collect::<Vec<_>>()
            .join("\n");
        let e = validate_file(file(&text).path(), None, 2, 1 << 20).unwrap_err();
        assert_eq!((e[0].code.as_str(), e[0].line), ("too_many_tasks", Some(3)));
    }

    #[test]
    fn a_line_over_the_body_limit_is_refused_with_its_number() {
        let long = line("b", "/v1/completions").replace("hi", &"x".repeat(500));
        let text = [
            line("a", "/v1/completions"),
            long,
            line("c", "/v1/completions"),
        ]
        .join("\n");
        let errs = validate_file(file(&text).path(), None, 10, 200).unwrap_err();
        assert_eq!(errs.len(), 1);
        assert_eq!(
            (errs[0].code.as_str(), errs[0].line),
            ("line_too_large", Some(2))
        );
        assert!(errs[0].message.contains("line 2") && errs[0].message.contains("200 bytes"));
        assert!(validate_file(file(&text).path(), None, 10, 600).is_ok());
    }

    #[test]
    fn offline_files_may_mix_the_two_endpoints() {
        let text = format!(
            "{}\n{}",
            line("a", "/v1/completions"),
            line("b", "/v1/chat/completions")
        );
        assert_eq!(
            validate_file(file(&text).path(), None, 10, 1 << 20)
                .unwrap()
                .total,
            2
        );
        // Only the endpoint table's batchable URLs.
        assert!(parse_line(1, &line("a", "/v1/embeddings"), None).is_ok());
        assert!(parse_line(1, &line("a", "/tokenize"), None).is_err());
    }
}
