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

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;

use palisade_api::wire::{NamespaceInfo, NamespaceList};
use palisade_storage::NamespaceSummary;

use super::locks::{page, scans_for, PageQuery};
use super::{listing_permit, ApiError, AppState, QueryParams};
use crate::auth::{Caller, Verb};

/// `GET /v1/fences?prefix=&after=&limit=`.
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    QueryParams(query): QueryParams<PageQuery>,
) -> Result<Response, ApiError> {
    let _permit = listing_permit(&state).await?;
    let (found, next) = page(
        scans_for(&caller, &query.prefix, &[Verb::Read]),
        &query,
        |n: &NamespaceSummary| n.name.as_str(),
        |page| {
            let backend = state.backend.clone();
            async move { Ok(backend.namespaces(page).await?) }
        },
    )
    .await?;
    let list = NamespaceList {
        namespaces: found
            .into_iter()
            .filter(|n| caller.may(Verb::Read, &n.name))
            .map(|n| NamespaceInfo {
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
