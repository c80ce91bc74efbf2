//! `GET /v1/fences`: the namespaces of the fenced store, a page at a time, each with its
//! high-water mark and what it holds.
//!
//! Read-only and paged like `GET /v1/locks` (`prefix`, `after`, `limit`, `next`), from
//! the store's ordered index of marks, under the same bound on listings running at once.
//! With authentication on it lists only the namespaces the caller may `read`, reading
//! only the parts of the index its grants cover.
//!
//! A namespace is listed once a mutation was admitted to it (that is when it gets a
//! mark); a namespace nobody wrote is not.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use palisade_api::ErrorCode;
use palisade_storage::NamespaceSummary;

use super::locks::{page, scans_for};
use super::{ApiError, AppState};
use crate::auth::{Caller, Verb};

/// `GET /v1/fences?prefix=&after=&limit=`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceListQuery {
    #[serde(default)]
    prefix: String,
    after: Option<String>,
    limit: Option<usize>,
}

/// One namespace as listed.
#[derive(Serialize)]
struct NamespaceView {
    lock: String,
    high_water: u64,
    seq: u64,
    policy: String,
    /// `null` when the backend has not counted the namespace yet (see
    /// [`NamespaceSummary::usage`]).
    keys: Option<u64>,
    bytes: Option<u64>,
}

#[derive(Serialize)]
struct NamespaceList {
    namespaces: Vec<NamespaceView>,
    /// Pass as `after` for the next page; `null` on the last page.
    next: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<NamespaceListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = query.map_err(|e| ApiError::bad_request(e.body_text()))?.0;
    // Held until the answer is encoded: that is part of the work it bounds.
    let _permit = state
        .listings
        .acquire()
        .await
        .map_err(|_| ApiError::new(ErrorCode::Unavailable, "the server is shutting down"))?;
    let (found, next) = page(
        scans_for(&caller, &query.prefix, &[Verb::Read]),
        query.after.as_deref(),
        query.limit,
        |n: &NamespaceSummary| n.name.as_str(),
        |from: String, after: Option<String>, n| {
            let backend = state.backend.clone();
            async move { Ok(backend.namespaces(&from, after.as_deref(), n).await?) }
        },
    )
    .await?;
    let list = NamespaceList {
        namespaces: found
            .into_iter()
            .filter(|n| caller.may(Verb::Read, &n.name))
            .map(|n| NamespaceView {
                policy: state.policies.policy(&n.name).to_string(),
                high_water: n.high_water.epoch,
                seq: n.high_water.seq,
                keys: n.usage.map(|u| u.keys),
                bytes: n.usage.map(|u| u.bytes),
                lock: n.name,
            })
            .collect(),
        next,
    };
    Ok(Json(list).into_response())
}
