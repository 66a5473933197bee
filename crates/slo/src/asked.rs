//! [`Asked`]: what one request asked for, read from its body and headers (the body
//! wins over a header), validated once, and capped by the caller's key.

use crate::class::SloClass;
use crate::error::SloError;
use crate::headers;

/// The SLO fields of one request before the profile's defaults apply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Asked {
    /// The class asked for explicitly (body `slo_class`, else `x-slo-class`).
    pub class: Option<SloClass>,
    /// The gateway's inference objective, mapped to a class by the policy when no
    /// class was asked.
    pub objective: Option<String>,
    /// TTFT target, milliseconds (body `ttft_slo_ms`, else the gateway header).
    pub ttft_ms: Option<f64>,
    /// TPOT target, milliseconds (body `tpot_slo_ms`, else the gateway header).
    pub tpot_ms: Option<f64>,
}

/// A latency target must be a positive, finite number of milliseconds.
pub fn check_target_ms(param: &'static str, ms: f64) -> Result<f64, SloError> {
    if ms.is_finite() && ms > 0.0 {
        Ok(ms)
    } else {
        Err(SloError::Target {
            param,
            value: ms.to_string(),
        })
    }
}

impl Asked {
    /// Reads a request: the body's fields (already typed), else the headers
    /// (`header(name)` gives a header's raw value). Every target is validated.
    pub fn read<'h>(
        body: Asked,
        header: impl Fn(&str) -> Option<&'h [u8]>,
    ) -> Result<Asked, SloError> {
        let text = |name: &str| header(name).map(|v| std::str::from_utf8(v).map(str::trim));
        let class = match body.class {
            Some(c) => Some(c),
            None => match text(headers::CLASS) {
                None => None,
                Some(v) => Some(
                    v.map_err(|_| "not ASCII".to_string())
                        .and_then(str::parse)
                        .map_err(|e| SloError::Class {
                            param: "X-SLO-Class",
                            reason: format!("X-SLO-Class header: {e}"),
                        })?,
                ),
            },
        };
        let objective = match body.objective {
            Some(o) => Some(o),
            None => headers::first(&headers::OBJECTIVE, text)
                .and_then(|(_, v)| v.ok())
                .map(str::to_owned),
        };
        let header_ms = |names: [&'static str; 2]| -> Result<Option<f64>, SloError> {
            let Some((name, v)) = headers::first(&names, text) else {
                return Ok(None);
            };
            let ms =
                v.ok()
                    .and_then(|s| s.parse::<f64>().ok())
                    .ok_or_else(|| SloError::Target {
                        param: name,
                        value: String::from_utf8_lossy(header(name).unwrap_or_default())
                            .into_owned(),
                    })?;
            check_target_ms(name, ms).map(Some)
        };
        let asked = Asked {
            class,
            objective,
            ttft_ms: match body.ttft_ms {
                Some(t) => Some(t),
                None => header_ms(headers::TTFT)?,
            },
            tpot_ms: match body.tpot_ms {
                Some(t) => Some(t),
                None => header_ms(headers::TPOT)?,
            },
        };
        asked.validate()?;
        Ok(asked)
    }

    /// The one check of the targets (also run by the engine on requests that did
    /// not come through [`Asked::read`]).
    pub fn validate(&self) -> Result<(), SloError> {
        if let Some(t) = self.ttft_ms {
            check_target_ms("ttft_slo_ms", t)?;
        }
        if let Some(t) = self.tpot_ms {
            check_target_ms("tpot_slo_ms", t)?;
        }
        Ok(())
    }

    /// Applies the caller's key: a key capped at batch may not ask for
    /// interactive (403) and runs everything else as batch.
    pub fn cap(mut self, ceiling: Option<SloClass>) -> Result<Asked, SloError> {
        match (ceiling, self.class) {
            (Some(SloClass::Batch), Some(SloClass::Interactive)) => Err(SloError::Forbidden),
            (Some(SloClass::Batch), _) => {
                self.class = Some(SloClass::Batch);
                Ok(self)
            }
            _ => Ok(self),
        }
    }

    /// Runs as `class` whatever was asked (a Batch API line is always batch).
    pub fn force(mut self, class: SloClass) -> Asked {
        self.class = Some(class);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(body: Asked, hs: &[(&str, &str)]) -> Result<Asked, SloError> {
        let m: HashMap<String, Vec<u8>> = hs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        Asked::read(body, |n| m.get(n).map(Vec::as_slice))
    }

    #[test]
    fn body_wins_over_headers_and_llm_d_names_over_older_ones() {
        let hs = [
            ("x-slo-class", "batch"),
            ("x-llm-d-slo-ttft-ms", "300"),
            ("x-slo-ttft-ms", "900"),
            ("x-slo-tpot-ms", "40"),
            ("x-gateway-inference-objective", "old"),
            ("x-llm-d-inference-objective", " chat "),
        ];
        let a = read(Asked::default(), &hs).unwrap();
        assert_eq!(a.class, Some(SloClass::Batch));
        assert_eq!((a.ttft_ms, a.tpot_ms), (Some(300.0), Some(40.0)));
        assert_eq!(a.objective.as_deref(), Some("chat"));
        let body = Asked {
            class: Some(SloClass::Interactive),
            ttft_ms: Some(100.0),
            ..Asked::default()
        };
        let a = read(body, &hs).unwrap();
        assert_eq!(a.class, Some(SloClass::Interactive));
        assert_eq!((a.ttft_ms, a.tpot_ms), (Some(100.0), Some(40.0)));
    }

    #[test]
    fn bad_values_name_their_field_or_header() {
        let e = read(Asked::default(), &[("x-slo-class", "bulk")]).unwrap_err();
        assert_eq!((e.param(), e.status()), ("X-SLO-Class", 400));
        assert!(e.to_string().contains("'bulk'"), "{e}");
        for v in ["abc", "0", "-5", "inf", "NaN"] {
            let e = read(Asked::default(), &[("x-llm-d-slo-tpot-ms", v)]).unwrap_err();
            assert_eq!(e.param(), "x-llm-d-slo-tpot-ms", "{v}");
        }
        let body = Asked {
            ttft_ms: Some(0.0),
            ..Asked::default()
        };
        assert_eq!(read(body, &[]).unwrap_err().param(), "ttft_slo_ms");
        let e = Asked::read(Asked::default(), |_| Some(&[0xff][..])).unwrap_err();
        assert_eq!(e.param(), "X-SLO-Class");
    }

    #[test]
    fn a_batch_key_caps_the_class() {
        let batch = Some(SloClass::Batch);
        let ask = |c| Asked {
            class: c,
            ..Asked::default()
        };
        assert_eq!(ask(None).cap(batch).unwrap().class, batch);
        assert_eq!(ask(batch).cap(batch).unwrap().class, batch);
        let e = ask(Some(SloClass::Interactive)).cap(batch).unwrap_err();
        assert_eq!(
            (e, SloError::Forbidden.status()),
            (SloError::Forbidden, 403)
        );
        assert_eq!(ask(None).cap(None).unwrap().class, None);
        let i = Some(SloClass::Interactive);
        assert_eq!(ask(i).cap(Some(SloClass::Interactive)).unwrap().class, i);
        assert_eq!(ask(i).force(SloClass::Batch).class, batch);
    }
}
