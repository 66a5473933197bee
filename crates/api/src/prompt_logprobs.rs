//! vLLM's `prompt_logprobs` wire shape: per prompt position, an object from token
//! id (as a string) to `{logprob, rank, decoded_token}`, holding the prompt token
//! and its best alternatives (`null` for the first position: nothing before it).

use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One token's entry at a prompt position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PromptTokenLogprob {
    pub logprob: f32,
    /// 1 + how many tokens the model found likelier.
    pub rank: u32,
    pub decoded_token: String,
}

/// One prompt position: `(token id, entry)` pairs, the prompt token first, then
/// the alternatives best first (a token appears once).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptLogprobsEntry(pub Vec<(u32, PromptTokenLogprob)>);

impl Serialize for PromptLogprobsEntry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (id, e) in &self.0 {
            m.serialize_entry(&id.to_string(), e)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for PromptLogprobsEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let m = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
        m.into_iter()
            .map(|(k, v)| {
                let id = k.parse().map_err(D::Error::custom)?;
                let e = serde_json::from_value(v).map_err(D::Error::custom)?;
                Ok((id, e))
            })
            .collect::<Result<_, _>>()
            .map(PromptLogprobsEntry)
    }
}

/// `{token id: {logprob, rank, decoded_token}}`.
impl utoipa::PartialSchema for PromptLogprobsEntry {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .additional_properties(Some(AdditionalProperties::RefOr(
                utoipa::openapi::Ref::from_schema_name("PromptTokenLogprob").into(),
            )))
            .into()
    }
}
impl utoipa::ToSchema for PromptLogprobsEntry {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_as_vllm_does() {
        let e = PromptLogprobsEntry(vec![
            (
                7,
                PromptTokenLogprob {
                    logprob: -2.5,
                    rank: 3,
                    decoded_token: " b".into(),
                },
            ),
            (
                1,
                PromptTokenLogprob {
                    logprob: -0.5,
                    rank: 1,
                    decoded_token: " a".into(),
                },
            ),
        ]);
        let s = serde_json::to_string(&vec![None, Some(e.clone())]).unwrap();
        assert_eq!(
            s,
            r#"[null,{"7":{"logprob":-2.5,"rank":3,"decoded_token":" b"},"1":{"logprob":-0.5,"rank":1,"decoded_token":" a"}}]"#
        );
        let back: Vec<Option<PromptLogprobsEntry>> = serde_json::from_str(&s).unwrap();
        assert_eq!(back[1].as_ref(), Some(&e));
    }
}
