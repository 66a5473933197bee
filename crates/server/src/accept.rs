//! The prologue every JSON generation endpoint shares, as one extractor: the body
//! read whole (its size and read-time refusals mapped to 413 / 408), the server
//! still accepting (503 while draining), the body parsed into the endpoint's type
//! (400 naming the field), the model it names checked (404), the caller and the
//! headers kept. The Batch API's dispatch builds the same from a line.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;
use sloserve_api::{parse_json, NamesModel};

use crate::error::ServerError;
use crate::keys::Caller;
use crate::state::AppState;

/// A parsed, checked request of type `T` with what its handler needs beside it.
pub struct Accepted<T> {
    pub state: Arc<AppState>,
    pub req: T,
    /// The key's identity (the open caller on a keyless server).
    pub caller: Caller,
    pub headers: HeaderMap,
}

impl<T: DeserializeOwned + NamesModel> Accepted<T> {
    /// The prologue over a body already read (or refused while reading).
    pub fn new(
        state: Arc<AppState>,
        caller: Option<Caller>,
        headers: HeaderMap,
        body: Result<Bytes, BytesRejection>,
    ) -> Result<Self, ServerError> {
        let body = body.map_err(|r| ServerError::from_body_rejection(r, state.max_body_bytes))?;
        state.check_accepting()?;
        let req: T = parse_json(&body)?;
        state.check_model(req.model())?;
        Ok(Accepted {
            state,
            req,
            caller: caller.unwrap_or(Caller::OPEN),
            headers,
        })
    }
}

impl<T: DeserializeOwned + NamesModel> FromRequest<Arc<AppState>> for Accepted<T> {
    type Rejection = ServerError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ServerError> {
        let caller = req.extensions().get::<Caller>().copied();
        let headers = req.headers().clone();
        let body = Bytes::from_request(req, state).await;
        Accepted::new(state.clone(), caller, headers, body)
    }
}
