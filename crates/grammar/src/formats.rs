//! String formats generated from conservative patterns: llguidance's own format
//! regexes are looser than strict validators (leap seconds anywhere, February 29th
//! of any year, e-mail local parts past RFC 5321's 64 octets), so a schema's
//! `format` of a string is replaced by a pattern whose every match is valid: a
//! subset of the format, never an invalid value.

use serde_json::Value;

/// Days of each month, February up to the 28th.
const DATE: &str = r"[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))";
/// Seconds 00-59, an optional fraction, a zone.
const TIME: &str = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
/// A dot-atom local part of at most 49 octets, a domain of 2 to 4 labels with an
/// alphabetic top level.
const EMAIL: &str = r"[A-Za-z0-9_%+-]{1,32}(?:\.[A-Za-z0-9_%+-]{1,16})?@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,30}[A-Za-z0-9])?\.){1,3}[A-Za-z]{2,12}";

/// The pattern sloserve generates for `format`, when it narrows llguidance's.
fn pattern(format: &str) -> Option<String> {
    Some(match format {
        "date" => format!("^{DATE}$"),
        "time" => format!("^{TIME}$"),
        "date-time" => format!("^{DATE}T{TIME}$"),
        "email" => format!("^{EMAIL}$"),
        _ => return None,
    })
}

/// Keywords whose values are data, not schemas: left alone.
const DATA_KEYWORDS: &[&str] = &["const", "enum", "default", "examples", "x-guidance"];

/// Rewrites every string subschema with a narrowed `format` (and no `pattern` of
/// its own) to that pattern.
pub(crate) fn narrow_formats(schema: &mut Value) {
    match schema {
        Value::Object(obj) => {
            let is_string = match obj.get("type") {
                None => true,
                Some(Value::String(t)) => t == "string",
                Some(_) => false,
            };
            let narrowed = match obj.get("format") {
                Some(Value::String(f)) if is_string && !obj.contains_key("pattern") => pattern(f),
                _ => None,
            };
            if let Some(p) = narrowed {
                obj.remove("format");
                obj.insert("pattern".into(), Value::String(p));
                obj.entry("type")
                    .or_insert_with(|| Value::String("string".into()));
            }
            for (k, v) in obj.iter_mut() {
                if !DATA_KEYWORDS.contains(&k.as_str()) {
                    narrow_formats(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(narrow_formats),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn formats_become_patterns_except_in_data() {
        let mut s = json!({
            "type": "object",
            "properties": {
                "a": {"type": "string", "format": "email"},
                "b": {"type": "string", "format": "date", "pattern": "^2024"},
                "c": {"type": "string", "format": "uuid"},
                "d": {"const": {"format": "email"}},
            },
            "$defs": {"t": {"format": "date-time"}}
        });
        narrow_formats(&mut s);
        assert!(s["properties"]["a"]["pattern"]
            .as_str()
            .unwrap()
            .contains('@'));
        assert!(s["properties"]["a"].get("format").is_none());
        assert_eq!(s["properties"]["b"]["pattern"], json!("^2024"));
        assert_eq!(s["properties"]["c"]["format"], json!("uuid"));
        assert_eq!(s["properties"]["d"]["const"], json!({"format": "email"}));
        assert_eq!(s["$defs"]["t"]["type"], json!("string"));
    }
}
