//! [`parse_json`]: a request body into a typed request, with errors that name the
//! field at fault (`param`) using serde_json's error path.

use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Makes serde's type names readable: "expected u32" -> "expected an integer".
fn humanize(msg: &str) -> String {
    let mut m = msg.to_string();
    for t in [
        "u8", "u16", "u32", "u64", "usize", "i8", "i16", "i32", "i64", "isize",
    ] {
        m = m.replace(&format!("expected {t}"), "expected an integer");
    }
    for t in ["f32", "f64"] {
        m = m.replace(&format!("expected {t}"), "expected a number");
    }
    // Drop serde_json's " at line 1 column 42" suffix from data errors.
    if let Some(i) = m.find(" at line ") {
        m.truncate(i);
    }
    m
}

/// `missing field `prompt`` -> "prompt".
fn missing_field(msg: &str) -> Option<String> {
    let rest = msg.strip_prefix("missing field `")?;
    Some(rest.split('`').next()?.to_string())
}

/// Parses `body` as JSON into `T`. Malformed JSON is a 400 without `param`; a wrong
/// type or missing field is a 400 whose `param` is the field's path (e.g.
/// `messages[0].content`).
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    // serde would also accept a struct written as an array; requests are objects.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                Err(e) => ApiError::bad_request(format!("malformed JSON body: {e}")),
                Ok(_) => ApiError::bad_request("the request body must be a JSON object"),
            },
        );
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let res: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    let value = match res {
        Ok(v) => v,
        Err(e) if e.path().to_string() == "." => {
            return Err(locate_flattened(body).unwrap_or_else(|| convert(e)))
        }
        Err(e) => return Err(convert(e)),
    };
    if let Err(e) = de.end() {
        return Err(ApiError::bad_request(format!(
            "malformed JSON body: {e} (trailing characters after the JSON value)"
        )));
    }
    Ok(value)
}

/// serde loses the path of an error inside a `#[serde(flatten)]`ed struct (it
/// reports the body's root); the shared request fields are flattened, so a root
/// error is looked for again in each of them alone, which names the field.
fn locate_flattened(body: &[u8]) -> Option<ApiError> {
    fn field_error<T: DeserializeOwned>(body: &[u8]) -> Option<ApiError> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let e = serde_path_to_error::deserialize::<_, T>(&mut de).err()?;
        (e.path().to_string() != ".").then(|| convert(e))
    }
    field_error::<crate::SamplingFields>(body)
        .or_else(|| field_error::<crate::RequestFields>(body))
        .or_else(|| field_error::<crate::ToolFields>(body))
}

fn convert(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    use serde_json::error::Category;
    match inner.classify() {
        Category::Syntax | Category::Eof | Category::Io => {
            ApiError::bad_request(format!("malformed JSON body: {inner}"))
        }
        Category::Data => {
            let msg = humanize(&inner.to_string());
            if path == "." || path.is_empty() {
                if let Some(field) = missing_field(&msg) {
                    return ApiError::invalid(&field, format!("{field}: field is required"));
                }
                if msg.starts_with("invalid type") {
                    return ApiError::bad_request(format!(
                        "the request body must be a JSON object ({msg})"
                    ));
                }
                return ApiError::bad_request(msg);
            }
            if let Some(field) = missing_field(&msg) {
                let p = format!("{path}.{field}");
                return ApiError::invalid(&p, format!("{p}: field is required"));
            }
            ApiError::invalid(&path, format!("{path}: {msg}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChatCompletionRequest, CompletionRequest};

    #[test]
    fn malformed_json_is_400_without_param() {
        let e = parse_json::<CompletionRequest>(b"{\"prompt\": ").unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.param.is_none());
        assert!(e.message.contains("malformed JSON"), "{}", e.message);
        let e = parse_json::<CompletionRequest>(b"[1,2]").unwrap_err();
        assert!(e.message.contains("JSON object"), "{}", e.message);
        let e = parse_json::<CompletionRequest>(b"{\"prompt\":\"a\"} x").unwrap_err();
        assert!(e.message.contains("malformed"), "{}", e.message);
    }

    #[test]
    fn wrong_types_name_the_field() {
        let e =
            parse_json::<CompletionRequest>(br#"{"prompt":"a","max_tokens":"ten"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert!(
            e.message.starts_with("max_tokens: invalid type"),
            "{}",
            e.message
        );
        assert!(e.message.contains("expected an integer"), "{}", e.message);
        let e =
            parse_json::<CompletionRequest>(br#"{"prompt":"a","temperature":[1]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e =
            parse_json::<ChatCompletionRequest>(br#"{"messages":[{"role":"user","content":5}]}"#)
                .unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("messages[0].content"),
            "{}",
            e.message
        );
        let e =
            parse_json::<ChatCompletionRequest>(br#"{"messages":[{"content":"hi"}]}"#).unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("messages[0].role"),
            "{}",
            e.message
        );
        let e = parse_json::<CompletionRequest>(br#"{"max_tokens":3}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"), "{}", e.message);
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let r: CompletionRequest =
            parse_json(br#"{"prompt":"a","frobnicate":true,"priority":3}"#).unwrap();
        assert_eq!(r.prompt, crate::Prompt::Text("a".into()));
    }
}

/// A request body that may name the model it is for (`model`).
pub trait NamesModel {
    fn model(&self) -> Option<&str>;
}

macro_rules! names_model {
    ($($t:ty),*) => {$(
        impl NamesModel for $t {
            fn model(&self) -> Option<&str> {
                self.model.as_deref()
            }
        }
    )*};
}

names_model!(
    crate::CompletionRequest,
    crate::ChatCompletionRequest,
    crate::ResponsesRequest,
    crate::TokenizeRequest,
    crate::DetokenizeRequest,
    crate::EmbeddingRequest,
    crate::RerankRequest,
    crate::ScoreRequest
);
