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
/// Inference Extension's older one (both as llm-d-router's EPP reads them). A
/// replica believes it only from a trusted hop (`--trust-gateway-headers`); the
/// router sets it from the caller's key ([`crate::key_digest`]).
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
/// On an error response: whose failure it is ([`ErrorOrigin`]), so a router counts
/// only a replica's own faults against it and retries only what another replica
/// could answer.
pub const ERROR_ORIGIN: &str = "x-sloserve-error-origin";

/// The value of [`ERROR_ORIGIN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorOrigin {
    /// The request's own failure (its content, its deadline, its key): another
    /// replica would fail it the same way; never held against the replica.
    Request,
    /// The replica is busy or going away (overloaded, draining): another replica
    /// may take it; not a fault.
    Load,
    /// The replica failed (an internal error, a stopped engine): a fault.
    Replica,
}

impl ErrorOrigin {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorOrigin::Request => "request",
            ErrorOrigin::Load => "load",
            ErrorOrigin::Replica => "replica",
        }
    }

    /// The header's value; anything else is `None` (treated as no header).
    pub fn parse(v: &[u8]) -> Option<Self> {
        match v {
            b"request" => Some(ErrorOrigin::Request),
            b"load" => Some(ErrorOrigin::Load),
            b"replica" => Some(ErrorOrigin::Replica),
            _ => None,
        }
    }

    /// The origin an error of this HTTP status has unless its sender knows better:
    /// 429 and 503 load, any other 4xx the request's, any other 5xx the replica's.
    pub fn of_status(status: u16) -> Self {
        match status {
            429 | 503 => ErrorOrigin::Load,
            s if s >= 500 => ErrorOrigin::Replica,
            _ => ErrorOrigin::Request,
        }
    }
}

/// The first of `names` (a header and its older name) that `get` finds, with the
/// name it was found under: llm-d's name wins over the older one.
pub fn first<V>(
    names: &[&'static str],
    get: impl Fn(&str) -> Option<V>,
) -> Option<(&'static str, V)> {
    names.iter().find_map(|&n| get(n).map(|v| (n, v)))
}
