//! `Constraint`: the typed constraint a request asks for, and the OpenAI
//! `response_format` object turned into one.

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

use crate::GrammarError;

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON document valid against `schema`. `strict`: keywords the engine
    /// cannot enforce are an error; otherwise they are ignored (lenient).
    JsonSchema { schema: Value, strict: bool },
    /// A whole-output regular expression (Rust `regex` syntax, anchored).
    Regex(String),
    /// A Lark grammar in llguidance's dialect (`%json {...}` embeds a schema).
    Lark(String),
}

impl Constraint {
    /// A stable text of the constraint, the compile cache's key.
    pub fn cache_key(&self) -> String {
        match self {
            Constraint::JsonObject => "json_object".into(),
            Constraint::JsonSchema { schema, strict } => format!("json_schema/{strict}/{schema}"),
            Constraint::Regex(r) => format!("regex/{r}"),
            Constraint::Lark(g) => format!("lark/{g}"),
        }
    }

    /// The llguidance grammar. JSON is generated with fixed separators `", "` and
    /// `": "` (the text models are trained on) and no free whitespace, so output is
    /// bounded; a schema's own `x-guidance` object overrides this.
    pub(crate) fn to_grammar(&self) -> Result<TopLevelGrammar, GrammarError> {
        Ok(match self {
            Constraint::JsonObject => {
                TopLevelGrammar::from_json_schema(with_options(json!({"type": "object"}), false))
            }
            Constraint::JsonSchema { schema, strict } => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(GrammarError::Invalid(
                        "a JSON schema must be an object or a boolean".into(),
                    ));
                }
                TopLevelGrammar::from_json_schema(with_options(schema.clone(), !strict))
            }
            Constraint::Regex(r) => TopLevelGrammar::from_regex(r),
            Constraint::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        })
    }
}

/// `patternProperties` entries anywhere in `schema` (every object with that key
/// counts, so a property of that name too: an over-count is harmless).
pub(crate) fn pattern_properties(schema: &Value) -> usize {
    let mut n = 0;
    let mut stack = vec![schema];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(o) => {
                if let Some(Value::Object(p)) = o.get("patternProperties") {
                    n += p.len();
                }
                stack.extend(o.values());
            }
            Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
    n
}

/// Adds sloserve's JSON options as `x-guidance` unless the schema has its own.
fn with_options(schema: Value, lenient: bool) -> Value {
    let mut schema = match schema {
        Value::Bool(true) => json!({}),
        Value::Bool(false) => json!({"not": {}}),
        s => s,
    };
    crate::formats::narrow_formats(&mut schema);
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(|| {
            json!({
                "item_separator": ", ",
                "key_separator": ": ",
                "whitespace_flexible": false,
                "lenient": lenient,
            })
        });
    }
    schema
}

/// The constraint of an OpenAI `response_format` value: `None` for `text` (or no
/// value), `JsonObject` for `json_object`, `JsonSchema` for
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}` (no
/// `schema`: any JSON object; `strict` defaults to false as in OpenAI's API).
pub fn from_response_format(rf: &Value) -> Result<Option<Constraint>, GrammarError> {
    if rf.is_null() {
        return Ok(None);
    }
    let obj = rf
        .as_object()
        .ok_or_else(|| GrammarError::Invalid("response_format must be an object".into()))?;
    let ty = obj
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| GrammarError::Invalid("response_format.type must be a string".into()))?;
    match ty {
        "text" => Ok(None),
        "json_object" => Ok(Some(Constraint::JsonObject)),
        "json_schema" => {
            let js = obj.get("json_schema").ok_or_else(|| {
                GrammarError::Invalid(
                    "response_format.json_schema is required with type json_schema".into(),
                )
            })?;
            let js = js.as_object().ok_or_else(|| {
                GrammarError::Invalid("response_format.json_schema must be an object".into())
            })?;
            match js.get("name") {
                Some(Value::String(n)) if valid_name(n) => {}
                Some(_) => return Err(GrammarError::Invalid(
                    "response_format.json_schema.name must be a-z, A-Z, 0-9, _ or -, at most 64"
                        .into(),
                )),
                None => {
                    return Err(GrammarError::Invalid(
                        "response_format.json_schema.name is required".into(),
                    ))
                }
            }
            let strict = match js.get("strict") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(GrammarError::Invalid(
                        "response_format.json_schema.strict must be a boolean".into(),
                    ))
                }
            };
            match js.get("schema") {
                None | Some(Value::Null) => Ok(Some(Constraint::JsonObject)),
                Some(schema) => Ok(Some(Constraint::JsonSchema {
                    schema: schema.clone(),
                    strict,
                })),
            }
        }
        other => Err(GrammarError::Invalid(format!(
            "response_format.type '{other}' is not one of text, json_object, json_schema"
        ))),
    }
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_formats_map_to_constraints() {
        assert_eq!(from_response_format(&Value::Null).unwrap(), None);
        assert_eq!(
            from_response_format(&json!({"type": "text"})).unwrap(),
            None
        );
        assert_eq!(
            from_response_format(&json!({"type": "json_object"})).unwrap(),
            Some(Constraint::JsonObject)
        );
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let rf = json!({"type": "json_schema", "json_schema": {"name": "my-schema_1", "schema": s, "strict": true}});
        assert_eq!(
            from_response_format(&rf).unwrap(),
            Some(Constraint::JsonSchema {
                schema: s.clone(),
                strict: true
            })
        );
        // strict defaults to false; no schema: any object.
        let rf = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s}});
        assert!(matches!(
            from_response_format(&rf).unwrap(),
            Some(Constraint::JsonSchema { strict: false, .. })
        ));
        let rf = json!({"type": "json_schema", "json_schema": {"name": "x"}});
        assert_eq!(
            from_response_format(&rf).unwrap(),
            Some(Constraint::JsonObject)
        );
    }

    #[test]
    fn json_options_are_added_unless_the_schema_has_its_own() {
        let v = with_options(json!({"type": "object"}), true);
        assert_eq!(v["x-guidance"]["lenient"], json!(true));
        assert_eq!(v["x-guidance"]["key_separator"], json!(": "));
        let own = json!({"type": "object", "x-guidance": {"whitespace_flexible": true}});
        assert_eq!(with_options(own.clone(), false), own);
        assert_eq!(with_options(json!(true), false)["type"], Value::Null);
    }
}
