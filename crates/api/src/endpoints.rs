//! The endpoint table: every HTTP endpoint sloserve serves, once — its path,
//! methods, body, what runs it, whether the Batch API takes it, whether it
//! streams and who may call it. The server's routes, the OpenAPI document's
//! paths, the Batch API's accepted URLs and its dispatch, the router's forwarding
//! and the open (keyless) paths are all read from [`TABLE`]; a test in each of
//! those places checks its set against it.

/// One endpoint. A `match` on it names every endpoint: adding one here makes
/// every place that serves, documents or forwards endpoints say what it does
/// with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Completions,
    ChatCompletions,
    Responses,
    Embeddings,
    Rerank,
    Score,
    CompletionsRender,
    ChatCompletionsRender,
    Models,
    Model,
    Tokenize,
    Detokenize,
    TokenizerFile,
    TokenizerInfo,
    Files,
    File,
    FileContent,
    Batches,
    Batch,
    BatchCancel,
    Health,
    Ready,
    Metrics,
    OpenApi,
    SloPage,
    SloScript,
    SloStyle,
    SloStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Get,
    Post,
    Delete,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Delete => "DELETE",
        }
    }
}

/// What runs a request: decides where the router sends it and what the server
/// needs to answer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runs {
    /// The model generates: admission, SLO class, the engine's steps. The router
    /// sends it by its class and prompt prefix.
    Generation,
    /// The model prefills and pools (embeddings, rerank, score): admission, SLO
    /// class (batch unless the request asks), the engine's steps; nothing is
    /// sampled. The router sends it by its class, the batch fleet by default.
    Pooling,
    /// The prompt is rendered and tokenized as generation would; the model does
    /// not run. Routed like generation (same class, same replica's template).
    Render,
    /// The tokenizer alone: any replica of the default class.
    Tokenizer,
    /// The served models' cards (the router answers with the union).
    Models,
    /// The Batch API's files and jobs: the batch fleet.
    Files,
    /// Answered by the process itself: probes, metrics, the API description.
    Process,
    /// The live SLO page and its data (one replica's view: the router sends it
    /// to the default class's fleet).
    Page,
}

/// Who may call an endpoint when API keys are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Anyone: probes and the API description.
    Open,
    /// Anyone, unless `--metrics-require-key`.
    OpenUnlessMetricsKey,
    /// A key (when keys are configured).
    Key,
}

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub endpoint: Endpoint,
    /// The path as axum routes it (`{id}` one segment, `{*id}` the rest).
    pub path: &'static str,
    pub methods: &'static [Method],
    /// The request body's schema name (OpenAPI components), if it takes a JSON body.
    pub body: Option<&'static str>,
    pub runs: Runs,
    /// A Batch API input line may name it as its `url`.
    pub batchable: bool,
    /// Answers Server-Sent Events with `stream: true`.
    pub streamable: bool,
    pub access: Access,
}

const fn row(
    endpoint: Endpoint,
    path: &'static str,
    methods: &'static [Method],
    body: Option<&'static str>,
    runs: Runs,
) -> Spec {
    Spec {
        endpoint,
        path,
        methods,
        body,
        runs,
        batchable: false,
        streamable: false,
        access: Access::Key,
    }
}

const fn generation(endpoint: Endpoint, path: &'static str, body: &'static str) -> Spec {
    Spec {
        batchable: true,
        streamable: true,
        ..row(endpoint, path, POST, Some(body), Runs::Generation)
    }
}

/// A prefill-only endpoint: the Batch API takes it, it never streams.
const fn pooling(endpoint: Endpoint, path: &'static str, body: &'static str) -> Spec {
    Spec {
        batchable: true,
        ..row(endpoint, path, POST, Some(body), Runs::Pooling)
    }
}

const fn open(s: Spec, access: Access) -> Spec {
    Spec { access, ..s }
}

const GET: &[Method] = &[Method::Get];
const POST: &[Method] = &[Method::Post];

use Endpoint as E;

/// Every endpoint sloserve serves (`sloserve serve`; `sloserve route` forwards
/// each by its [`Runs`]).
pub const TABLE: &[Spec] = &[
    generation(E::Completions, "/v1/completions", "CompletionRequest"),
    generation(
        E::ChatCompletions,
        "/v1/chat/completions",
        "ChatCompletionRequest",
    ),
    generation(E::Responses, "/v1/responses", "ResponsesRequest"),
    pooling(E::Embeddings, "/v1/embeddings", "EmbeddingRequest"),
    pooling(E::Rerank, "/v1/rerank", "RerankRequest"),
    pooling(E::Score, "/score", "ScoreRequest"),
    row(
        E::CompletionsRender,
        "/v1/completions/render",
        POST,
        Some("CompletionRequest"),
        Runs::Render,
    ),
    row(
        E::ChatCompletionsRender,
        "/v1/chat/completions/render",
        POST,
        Some("ChatCompletionRequest"),
        Runs::Render,
    ),
    row(E::Models, "/v1/models", GET, None, Runs::Models),
    row(E::Model, "/v1/models/{*id}", GET, None, Runs::Models),
    row(
        E::Tokenize,
        "/tokenize",
        POST,
        Some("TokenizeRequest"),
        Runs::Tokenizer,
    ),
    row(
        E::Detokenize,
        "/detokenize",
        POST,
        Some("DetokenizeRequest"),
        Runs::Tokenizer,
    ),
    // The served model's tokenizer as a Hugging Face folder's files, for
    // benchmark clients (aiperf, guidellm, vllm bench serve).
    row(
        E::TokenizerFile,
        "/tokenizer/{file}",
        GET,
        None,
        Runs::Tokenizer,
    ),
    row(
        E::TokenizerInfo,
        "/tokenizer_info",
        GET,
        None,
        Runs::Tokenizer,
    ),
    row(
        E::Files,
        "/v1/files",
        &[Method::Post, Method::Get],
        None,
        Runs::Files,
    ),
    row(
        E::File,
        "/v1/files/{id}",
        &[Method::Get, Method::Delete],
        None,
        Runs::Files,
    ),
    row(
        E::FileContent,
        "/v1/files/{id}/content",
        GET,
        None,
        Runs::Files,
    ),
    row(
        E::Batches,
        "/v1/batches",
        &[Method::Post, Method::Get],
        None,
        Runs::Files,
    ),
    row(E::Batch, "/v1/batches/{id}", GET, None, Runs::Files),
    row(
        E::BatchCancel,
        "/v1/batches/{id}/cancel",
        POST,
        None,
        Runs::Files,
    ),
    open(
        row(E::Health, "/health", GET, None, Runs::Process),
        Access::Open,
    ),
    open(
        row(E::Ready, "/ready", GET, None, Runs::Process),
        Access::Open,
    ),
    open(
        row(E::Metrics, "/metrics", GET, None, Runs::Process),
        Access::OpenUnlessMetricsKey,
    ),
    open(
        row(E::OpenApi, "/openapi.json", GET, None, Runs::Process),
        Access::Open,
    ),
    // The page's files hold no data; its data needs a key.
    open(row(E::SloPage, "/slo", GET, None, Runs::Page), Access::Open),
    open(
        row(E::SloScript, "/slo/app.js", GET, None, Runs::Page),
        Access::Open,
    ),
    open(
        row(E::SloStyle, "/slo/style.css", GET, None, Runs::Page),
        Access::Open,
    ),
    row(E::SloStatus, "/slo/status", GET, None, Runs::Page),
];

impl Endpoint {
    /// Its row of [`TABLE`].
    pub fn spec(self) -> &'static Spec {
        TABLE
            .iter()
            .find(|s| s.endpoint == self)
            .expect("every endpoint has a row (checked by a test)")
    }

    pub fn path(self) -> &'static str {
        self.spec().path
    }

    /// The endpoint a Batch API line's `url` names, if the Batch API takes it.
    pub fn from_batch_url(url: &str) -> Option<Endpoint> {
        TABLE
            .iter()
            .find(|s| s.batchable && s.path == url)
            .map(|s| s.endpoint)
    }
}

/// The rows of what `runs` runs.
pub fn running(runs: Runs) -> impl Iterator<Item = &'static Spec> {
    TABLE.iter().filter(move |s| s.runs == runs)
}

/// The URLs a Batch API input line may name.
pub fn batch_urls() -> impl Iterator<Item = &'static str> {
    TABLE.iter().filter(|s| s.batchable).map(|s| s.path)
}

/// Whether `path` (a request's exact path) may be called without a key.
pub fn is_open(path: &str, metrics_require_key: bool) -> bool {
    TABLE.iter().any(|s| {
        s.path == path
            && match s.access {
                Access::Open => true,
                Access::OpenUnlessMetricsKey => !metrics_require_key,
                Access::Key => false,
            }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_endpoint_has_one_row_and_paths_are_unique() {
        let mut seen = HashSet::new();
        let mut paths = HashSet::new();
        for s in TABLE {
            assert!(seen.insert(s.endpoint), "{:?} twice", s.endpoint);
            assert!(paths.insert(s.path), "{} twice", s.path);
            assert_eq!(s.endpoint.spec(), s);
            assert!(!s.methods.is_empty(), "{}", s.path);
            // Only what the model runs goes through a batch; only what it
            // generates streams.
            if s.batchable {
                assert!(
                    matches!(s.runs, Runs::Generation | Runs::Pooling),
                    "{}",
                    s.path
                );
            }
            if s.streamable {
                assert_eq!(s.runs, Runs::Generation, "{}", s.path);
            }
        }
        // The `match` in `name` lists every variant: it fails to compile when one is
        // added, and this loop fails when that one has no row.
        let all = [
            E::Completions,
            E::ChatCompletions,
            E::Responses,
            E::Embeddings,
            E::Rerank,
            E::Score,
            E::CompletionsRender,
            E::ChatCompletionsRender,
            E::Models,
            E::Model,
            E::Tokenize,
            E::Detokenize,
            E::TokenizerFile,
            E::TokenizerInfo,
            E::Files,
            E::File,
            E::FileContent,
            E::Batches,
            E::Batch,
            E::BatchCancel,
            E::Health,
            E::Ready,
            E::Metrics,
            E::OpenApi,
            E::SloPage,
            E::SloScript,
            E::SloStyle,
            E::SloStatus,
        ];
        for e in all {
            match e {
                E::Completions
                | E::ChatCompletions
                | E::Responses
                | E::Embeddings
                | E::Rerank
                | E::Score
                | E::CompletionsRender
                | E::ChatCompletionsRender
                | E::Models
                | E::Model
                | E::Tokenize
                | E::Detokenize
                | E::TokenizerFile
                | E::TokenizerInfo
                | E::Files
                | E::File
                | E::FileContent
                | E::Batches
                | E::Batch
                | E::BatchCancel
                | E::Health
                | E::Ready
                | E::Metrics
                | E::OpenApi
                | E::SloPage
                | E::SloScript
                | E::SloStyle
                | E::SloStatus => assert!(seen.contains(&e), "{e:?} has no row"),
            }
        }
        assert_eq!(all.len(), TABLE.len());
    }

    /// docs/serving.md's endpoint list names every path of the table.
    #[test]
    fn the_serving_docs_list_every_endpoint() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/serving.md"
        ))
        .unwrap();
        let start = doc.find("## Endpoints").expect("an Endpoints section");
        let section = &doc[start..];
        let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
        for s in TABLE {
            let path = s.path.replace("{*id}", "{id}");
            assert!(
                section.contains(&format!(" {path}`")),
                "docs/serving.md's Endpoints do not name {path}"
            );
        }
    }

    #[test]
    fn batch_urls_and_open_paths() {
        let urls: Vec<_> = batch_urls().collect();
        assert_eq!(
            urls,
            [
                "/v1/completions",
                "/v1/chat/completions",
                "/v1/responses",
                "/v1/embeddings",
                "/v1/rerank",
                "/score"
            ]
        );
        assert_eq!(
            Endpoint::from_batch_url("/v1/responses"),
            Some(E::Responses)
        );
        assert_eq!(Endpoint::from_batch_url("/v1/completions/render"), None);
        assert_eq!(
            Endpoint::from_batch_url("/v1/embeddings"),
            Some(E::Embeddings)
        );
        assert_eq!(Endpoint::from_batch_url("/tokenize"), None);
        assert!(is_open("/health", true) && is_open("/openapi.json", true));
        assert!(is_open("/metrics", false) && !is_open("/metrics", true));
        assert!(!is_open("/v1/models", false) && !is_open("/health/x", false));
        assert!(is_open("/slo", true) && is_open("/slo/app.js", true));
        assert!(!is_open("/slo/status", false) && !is_open("/slo/", false));
    }
}
