//! The request headers that carry a request's SLO contract: the only place their
//! names are written. Where two names are listed, the first (llm-d's) wins.

/// The class a client asks for ("interactive" or "batch").
pub const CLASS: &str = "x-slo-class";
/// The gateway's inference objective (mapped to a class by a profile's or the
/// router's `objectives`), llm-d's name then the older one.
pub const OBJECTIVE: [&str; 2] = [
    "x-llm-d-inference-objective",
    "x-gateway-inference-objective",
];
/// The gateway's TTFT target in milliseconds.
pub const TTFT: [&str; 2] = ["x-llm-d-slo-ttft-ms", "x-slo-ttft-ms"];
/// The gateway's TPOT target in milliseconds.
pub const TPOT: [&str; 2] = ["x-llm-d-slo-tpot-ms", "x-slo-tpot-ms"];
/// The gateway's fairness id: the flow (tenant, user) a request belongs to, for
/// fair order within its class's waiting queue; llm-d's name then the Gateway API
/// Inference Extension's older one (both as llm-d-router's EPP reads them).
pub const FAIRNESS_ID: [&str; 2] = [
    "x-llm-d-inference-fairness-id",
    "x-gateway-inference-fairness-id",
];
/// The client's or gateway's request id: used in the server's logs and echoed on
/// the response (one is made when the request has none).
pub const REQUEST_ID: &str = "x-request-id";
/// An API key (the other place is `Authorization: Bearer`).
pub const API_KEY: &str = "x-api-key";
/// On a refused or shed request's response: why, as one word the gateway can act
/// on (`queue-full`, `queue-wait`, `deadline`, `ttft`, `shed`, `draining`,
/// `stopped`).
pub const SHED_REASON: &str = "x-sloserve-shed-reason";

/// The first of `names` (a header and its older name) that `get` finds, with the
/// name it was found under: llm-d's name wins over the older one.
pub fn first<V>(
    names: &[&'static str],
    get: impl Fn(&str) -> Option<V>,
) -> Option<(&'static str, V)> {
    names.iter().find_map(|&n| get(n).map(|v| (n, v)))
}
