//! The HTTP routes of the Batch API: `/v1/files` (multipart upload streamed to
//! disk, list, get, content, delete) and `/v1/batches` (create, get, list, cancel).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Multipart, Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Extension;
use axum::{Json, Router};
use serde::Deserialize;
use sloserve_api::endpoints::{self, Endpoint as E, Runs};
use sloserve_api::{parse_json, ApiError};
use tokio::io::AsyncWriteExt;

use crate::error::Error;
use crate::line::new_id;
use crate::owner::Owner;
use crate::service::BatchService;
use crate::types::{CreateBatch, Deleted, FileObject, ListObject};
use crate::unix_now;

type Svc = State<Arc<BatchService>>;

/// The caller's [`Owner`], a request extension the server's auth middleware sets
/// on every request; a route reached without it answers 500 rather than guess.
type Caller = Option<Extension<Owner>>;

fn owner(c: Caller) -> Result<Owner, Error> {
    c.map(|Extension(o)| o).ok_or_else(|| {
        Error::Storage("no caller identity on the request (the auth middleware is missing)".into())
    })
}

/// The Batch API's routes (the endpoint table's [`Runs::Files`] rows), ready to
/// merge into the server's router (behind a layer that puts the caller's
/// [`Owner`] in each request's extensions). Each route sees only the caller's
/// objects: another owner's id is a 404.
pub fn routes(svc: Arc<BatchService>) -> Router {
    let mut r = Router::new();
    for spec in endpoints::running(Runs::Files) {
        let methods = match spec.endpoint {
            // The upload enforces `--max-batch-file-bytes` itself while streaming.
            E::Files => post(upload)
                .get(list_files)
                .layer(DefaultBodyLimit::disable()),
            E::File => get(get_file).delete(delete_file),
            E::FileContent => get(file_content),
            E::Batches => post(create_batch).get(list_batches),
            E::Batch => get(get_batch),
            E::BatchCancel => post(cancel_batch),
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
            | E::Health
            | E::Ready
            | E::Metrics
            | E::OpenApi
            | E::SloPage
            | E::SloScript
            | E::SloStyle
            | E::SloStatus => continue,
        };
        r = r.route(spec.path, methods);
    }
    r.with_state(svc)
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        if let Error::Storage(m) = &self {
            tracing::error!(error = %m, "batch API request failed");
        }
        api_error(&self.to_api())
    }
}

fn api_error(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(e.body())).into_response()
}

fn bad(param: &'static str, m: impl Into<String>) -> Error {
    Error::invalid(param, m)
}

async fn upload(
    State(svc): Svc,
    caller: Caller,
    mp: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Json<FileObject>, Error> {
    let owner = owner(caller)?;
    let mut mp = mp.map_err(|e| {
        bad(
            "file",
            format!("expected a multipart/form-data body with `file` and `purpose`: {e}"),
        )
    })?;
    let (max_file, quota) = (
        svc.config().max_file_bytes,
        svc.config().quota_bytes_per_owner,
    );
    // The bytes this owner may still add (checked again, atomically, at insert).
    let held = match quota {
        Some(_) => svc.held_bytes(&owner)?,
        None => 0,
    };
    let id = new_id("file-");
    let path = svc.files().file_path(&id);
    let (mut purpose, mut stored) = (None, None);
    let result: Result<(), Error> = async {
        while let Some(mut field) = mp
            .next_field()
            .await
            .map_err(|e| bad("file", format!("malformed multipart body: {e}")))?
        {
            match field.name() {
                Some("purpose") => {
                    purpose = Some(
                        field
                            .text()
                            .await
                            .map_err(|e| bad("purpose", e.to_string()))?,
                    )
                }
                Some("file") => {
                    let name = field.file_name().unwrap_or("upload.jsonl").to_string();
                    let mut f = tokio::fs::File::create(&path).await?;
                    let mut bytes = 0u64;
                    while let Some(chunk) = field
                        .chunk()
                        .await
                        .map_err(|e| bad("file", format!("upload interrupted: {e}")))?
                    {
                        bytes += chunk.len() as u64;
                        if bytes > max_file {
                            return Err(Error::TooLarge { limit: max_file });
                        }
                        if let Some(quota) = quota.filter(|&q| held + bytes > q) {
                            return Err(Error::QuotaExceeded { quota, held });
                        }
                        f.write_all(&chunk).await?;
                    }
                    f.sync_all().await?;
                    stored = Some((name, bytes));
                }
                _ => {}
            }
        }
        Ok(())
    }
    .await;
    let cleanup = || {
        let _ = std::fs::remove_file(&path);
    };
    if let Err(e) = result {
        cleanup();
        return Err(e);
    }
    let Some((filename, bytes)) = stored else {
        cleanup();
        return Err(bad("file", "file: missing (multipart field `file`)"));
    };
    match purpose.as_deref() {
        Some("batch") => {}
        Some(p) => {
            cleanup();
            return Err(bad(
                "purpose",
                format!("purpose: only \"batch\" is supported, got {p:?}"),
            ));
        }
        None => {
            cleanup();
            return Err(bad(
                "purpose",
                "purpose: missing (multipart field `purpose`)",
            ));
        }
    }
    let now = unix_now();
    let obj = FileObject {
        id,
        object: "file".into(),
        bytes,
        created_at: now,
        expires_at: svc.config().retention.map(|r| now + r.as_secs()),
        filename,
        purpose: "batch".into(),
        status: "processed".into(),
        status_details: None,
    };
    // Room left beside the results the owner's running batches hold.
    let room = quota.map(|q| q.saturating_sub(svc.pending_bytes(&owner)));
    if let Err(e) = svc.files().insert_file_within(&obj, &owner, room) {
        cleanup();
        return Err(e);
    }
    tracing::info!(file = %obj.id, bytes, "file uploaded");
    Ok(Json(obj))
}

#[derive(Deserialize)]
struct ListFiles {
    purpose: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
    order: Option<String>,
}

async fn list_files(
    State(svc): Svc,
    caller: Caller,
    q: Result<Query<ListFiles>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ListObject<FileObject>>, Error> {
    let Query(q) = q.map_err(|e| bad("query", format!("invalid query: {e}")))?;
    let limit = q.limit.unwrap_or(10_000);
    if !(1..=10_000).contains(&limit) {
        return Err(bad("limit", "limit: must be between 1 and 10000"));
    }
    let asc = match q.order.as_deref() {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(o) => {
            return Err(bad(
                "order",
                format!("order: must be asc or desc, got {o:?}"),
            ))
        }
    };
    let (data, more) = svc.files().list_files(
        &owner(caller)?,
        q.purpose.as_deref(),
        q.after.as_deref(),
        limit,
        asc,
    )?;
    Ok(Json(ListObject::new(data, more, |f| f.id.clone())))
}

fn file_or_404(svc: &BatchService, id: &str, caller: Caller) -> Result<FileObject, Error> {
    svc.files()
        .get_file(id, &owner(caller)?)?
        .ok_or_else(|| Error::NotFound {
            kind: "file",
            id: id.into(),
        })
}

async fn get_file(
    State(svc): Svc,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<FileObject>, Error> {
    Ok(Json(file_or_404(&svc, &id, caller)?))
}

async fn delete_file(
    State(svc): Svc,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Deleted>, Error> {
    file_or_404(&svc, &id, caller)?;
    if svc.file_in_use(&id)? {
        return Err(Error::Conflict(format!(
            "file {id} is the input of a batch that has not finished"
        )));
    }
    let deleted = svc.files().delete_file(&id)?;
    Ok(Json(Deleted {
        id,
        object: "file".into(),
        deleted,
    }))
}

async fn file_content(
    State(svc): Svc,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    let f = file_or_404(&svc, &id, caller)?;
    let file = tokio::fs::File::open(svc.files().file_path(&id)).await?;
    let stream = tokio_util::io::ReaderStream::new(file);
    let mut resp = Body::from_stream(stream).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/jsonl"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(f.bytes));
    Ok(resp)
}

async fn create_batch(State(svc): Svc, caller: Caller, body: Bytes) -> Result<Response, Error> {
    let owner = owner(caller)?;
    let req: CreateBatch = parse_json(&body).map_err(|e| Error::Invalid {
        param: "body",
        message: e.message,
    })?;
    Ok(Json(svc.create_batch(req, &owner)?).into_response())
}

async fn get_batch(
    State(svc): Svc,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    Ok(Json(svc.get_batch(&id, &owner(caller)?)?).into_response())
}

#[derive(Deserialize)]
struct ListBatches {
    limit: Option<usize>,
    after: Option<String>,
}

async fn list_batches(
    State(svc): Svc,
    caller: Caller,
    q: Result<Query<ListBatches>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Error> {
    let Query(q) = q.map_err(|e| bad("query", format!("invalid query: {e}")))?;
    let limit = q.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(bad("limit", "limit: must be between 1 and 100"));
    }
    Ok(Json(svc.list_batches(&owner(caller)?, q.after.as_deref(), limit)?).into_response())
}

async fn cancel_batch(
    State(svc): Svc,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    Ok(Json(svc.cancel_batch(&id, &owner(caller)?)?).into_response())
}
