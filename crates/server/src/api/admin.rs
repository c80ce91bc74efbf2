//! Admin routes: the issuer's signing keys (see [`crate::keys`]).
//!
//! - `GET /v1/admin/keys`: every key of the set (active, verifying, retired) and the
//!   `--trust-key-file` keys, with their times;
//! - `POST /v1/admin/keys/rotate`: a new key becomes active, the active one verifying;
//! - `POST /v1/admin/keys/{key_id}/retire`: a verifying key's tokens stop verifying.
//!
//! Only principals with `admin = true` may call them (403 `permission_denied` for anyone
//! else); with authentication off they are open like every other route. Each change is
//! durable before the answer and writes an `admin_action` line to the audit log.

use palisade_api::{ErrorDetail, QuotaResource};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::Json;

use palisade_api::wire::{AdminKeys, KeyRetired, KeysRotated};
use palisade_token::KeySet;

use super::{path, ApiError, AppState, RequestBody};
use crate::audit::AuditEvent;
use crate::auth::Caller;
use crate::keys::now_unix;

/// Longest key id accepted in a path (ids are 16 hex characters today).
const MAX_KEY_ID_LEN: usize = 64;

/// 403 `permission_denied` unless the caller is an admin (or authentication is off).
fn require_admin(caller: &Caller, action: &str) -> Result<(), ApiError> {
    match caller.principal() {
        Some(p) if !p.admin => {
            let event = AuditEvent::new("permission_denied")
                .principal(caller.name())
                .detail(format!("admin: {action}"));
            Err(ApiError::permission_denied(
                Some(&p.name),
                format!("only an admin principal may {action}"),
            )
            .audited(event))
        }
        _ => Ok(()),
    }
}

fn answer(state: &AppState) -> AdminKeys {
    AdminKeys {
        active: state.keys.key_set().active().key_id.clone(),
        keys: state.keys.all_keys(),
    }
}

/// `GET /v1/admin/keys`
pub async fn list_keys(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<AdminKeys>, ApiError> {
    require_admin(&caller, "list signing keys")?;
    Ok(Json(answer(&state)))
}

/// `POST /v1/admin/keys/rotate` (an empty body, or `{}`).
pub async fn rotate_keys(
    State(state): State<AppState>,
    caller: Caller,
    body: RequestBody,
) -> Result<Json<KeysRotated>, ApiError> {
    require_admin(&caller, "rotate signing keys")?;
    body.empty().await?;
    let previous = state.keys.key_set().active().key_id.clone();
    let set: Arc<KeySet> = state.keys.rotate(now_unix()).await?;
    let active = set.active().key_id.clone();
    // The key that was active when the change was made (another node may have rotated
    // in between, over etcd): the newest key before the new one.
    let previous = set
        .keys()
        .iter()
        .rev()
        .nth(1)
        .map_or(previous, |k| k.key_id.clone());
    state.audit.record(
        AuditEvent::new("admin_action")
            .principal(caller.name())
            .route("/v1/admin/keys/rotate")
            .detail(format!(
                "keys rotate: {active} active, {previous} verifying"
            )),
    );
    tracing::info!(%active, %previous, principal = caller.name().unwrap_or("-"), "signing key rotated");
    Ok(Json(KeysRotated {
        active,
        previous,
        keys: state.keys.all_keys(),
    }))
}

/// `POST /v1/admin/keys/{key_id}/retire` (an empty body, or `{}`).
pub async fn retire_key(
    State(state): State<AppState>,
    caller: Caller,
    key_id: Result<Path<String>, PathRejection>,
    body: RequestBody,
) -> Result<Json<KeyRetired>, ApiError> {
    require_admin(&caller, "retire signing keys")?;
    let key_id = path(key_id)?;
    let valid = !key_id.is_empty()
        && key_id.len() <= MAX_KEY_ID_LEN
        && key_id.bytes().all(|b| b.is_ascii_hexdigit());
    if !valid {
        return Err(ApiError::bad_request(format!(
            "a key id is 1 to {MAX_KEY_ID_LEN} hex characters (as GET /v1/admin/keys lists it)"
        )));
    }
    body.empty().await?;
    let (set, changed) = state.keys.retire(&key_id, now_unix()).await?;
    if changed {
        state.audit.record(
            AuditEvent::new("admin_action")
                .principal(caller.name())
                .route(&format!("/v1/admin/keys/{key_id}/retire"))
                .detail(format!("keys retire: {key_id} retired")),
        );
        tracing::info!(%key_id, principal = caller.name().unwrap_or("-"), "signing key retired");
    }
    Ok(Json(KeyRetired {
        retired: key_id,
        changed,
        active: set.active().key_id.clone(),
        keys: state.keys.all_keys(),
    }))
}

/// `POST /v1/admin/backup` (an empty body, or `{}`): a consistent snapshot of the
/// database taken while serving, sent as the backup file itself
/// (`application/octet-stream`, the format `palisade admin restore` reads). Embedded
/// backend only; see [`crate::recovery::online`].
pub async fn backup(
    State(state): State<AppState>,
    caller: Caller,
    body: RequestBody,
) -> Result<axum::response::Response, ApiError> {
    use crate::recovery::online::OnlineBackupError;
    use axum::response::IntoResponse;

    require_admin(&caller, "take backups")?;
    body.empty().await?;
    let Some(online) = state.backup.clone() else {
        return Err(ApiError::not_found(
            "this node keeps no data of its own (etcd backend): back up etcd with `etcdctl \
             snapshot save` (docs/operations.md)",
        ));
    };
    let (info, file) = online.take().await.map_err(|e| match e {
        OnlineBackupError::Busy => ApiError::quota_exceeded(QuotaResource::ConcurrentBackups, 1),
        OnlineBackupError::Failed(reason) => ApiError::new(
            ErrorDetail::StorageFailed,
            format!("backup failed: {reason}"),
        ),
    })?;
    state.audit.record(
        AuditEvent::new("admin_action")
            .principal(caller.name())
            .route("/v1/admin/backup")
            .detail(format!(
                "backup {} (epochs up to {})",
                info.backup_id, info.epoch_bound
            )),
    );
    let length = file.metadata().map(|m| m.len()).ok();
    let chunks = futures::stream::unfold(tokio::fs::File::from_std(file), |mut file| async {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 64 * 1024];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(bytes::Bytes::from(buf)), file))
            }
            Err(e) => Some((Err(e), file)),
        }
    });
    let mut response = Body::from_stream(chunks).into_response();
    let h = response.headers_mut();
    h.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/octet-stream"),
    );
    if let Some(length) = length {
        h.insert(axum::http::header::CONTENT_LENGTH, length.into());
    }
    if let Ok(id) = axum::http::HeaderValue::from_str(&info.backup_id) {
        h.insert(palisade_api::headers::BACKUP_ID, id);
    }
    h.insert(
        palisade_api::headers::BACKUP_EPOCH_BOUND,
        info.epoch_bound.into(),
    );
    Ok(response)
}
