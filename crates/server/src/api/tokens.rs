//! Key and token routes: how resources learn the issuer's public keys, and Chubby's
//! CheckSequencer (is this token genuine, is its epoch current, is its lease alive?).

use axum::extract::State;
use axum::Json;

use palisade_api::wire::{KeysAnswer, PublicKey, TokenCheck, TokenCheckRequest};

use super::{ApiError, AppState, RequestBody};
use crate::auth::{Caller, Verb};

/// Every key whose tokens verify here: the active key, the verifying ones and the
/// `--trust-key-file` ones (listed as `verifying`). Retired keys are not listed.
pub async fn keys(State(state): State<AppState>) -> Json<KeysAnswer> {
    let keys: Vec<PublicKey> = state
        .keys
        .verifying_keys()
        .into_iter()
        .map(|k| PublicKey {
            key_id: k.key_id,
            alg: k.alg,
            public_key: k.public_key,
            status: Some(k.status),
        })
        .collect();
    Json(KeysAnswer { keys })
}

/// The `check` verb: on the token's lock when the token is genuine; for a token that is
/// not, on any lock (the answer names no lock).
pub async fn check(
    State(state): State<AppState>,
    caller: Caller,
    body: RequestBody,
) -> Result<Json<TokenCheck>, ApiError> {
    if !caller.may_any(Verb::Check) {
        return Err(ApiError::permission_denied(
            None,
            "may not check tokens of any lock",
        ));
    }
    let body: TokenCheckRequest = body.json().await?;
    let claims = match state.keys.verify(&body.token).await {
        Ok(claims) => claims,
        Err(e) => {
            return Ok(Json(TokenCheck {
                genuine: false,
                reason: Some(e.message().to_owned()),
                ..TokenCheck::default()
            }))
        }
    };
    caller.require(Verb::Check, &claims.lock)?;
    let view = state.issuer.status(&claims.lock).await?;
    let lease_alive = view.lease.as_ref().is_some_and(|l| l.epoch == claims.epoch);
    // While a lease is live its epoch is the newest issued for the lock (nothing is granted
    // above it until it ends). Without one, the last epoch granted; but where grants may
    // have gone unrecorded (after a restart, up to the reservation's ceiling) no token is
    // known to be the newest, so none is called current.
    let current_epoch = view.lease.as_ref().map_or(view.epoch, |l| l.epoch);
    let newest = view.lease.is_some() || view.granted_up_to == view.epoch;
    Ok(Json(TokenCheck {
        genuine: true,
        current: Some(current_epoch == claims.epoch && newest),
        lock: Some(claims.lock.clone()),
        epoch: Some(claims.epoch),
        holder: Some(claims.holder.clone()),
        key_id: Some(claims.key_id.clone()),
        current_epoch: Some(current_epoch),
        lease_alive: Some(lease_alive),
        reason: None,
    }))
}
