//! `POST /v1/gates/report`: what a gate in another resource (a PostgreSQL table, a Redis,
//! a SQLite file, an object store) admitted and refused, so that refusals at the resource
//! show where operators look: `/metrics` (`palisade_gate_admits_total{resource}`,
//! `palisade_gate_refusals_total{resource,code}`) and the events stream (`gate_refused`).
//!
//! The whole report is checked before anything is taken (every code known, every lock
//! name valid, at most [`MAX_REPORTED_REFUSALS`] refusals, the caller allowed to write
//! each lock it names), so a bad report changes nothing. The counts are always taken; the
//! refusals become events within [`crate::observe::GATE_EVENTS_PER_SECOND`] for all
//! gates together, and the answer says how many were dropped.
//!
//! What it does not do: the server does not check that a report is true. A principal
//! that may write a lock can report refusals for it that never happened; what a report
//! can do is bounded (counters by a fixed set of labels, events at a bounded rate).

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;

use palisade_api::wire::{GateReport, GateReportAnswer, MAX_REPORTED_REFUSALS};
use palisade_api::ErrorCode;

use super::{json_body, lock_name, ApiError, AppState};
use crate::auth::{Caller, Verb};

/// `POST /v1/gates/report`.
pub async fn report(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<GateReportAnswer>, ApiError> {
    caller.require_any(Verb::Write)?;
    let report: GateReport = json_body(&headers, body).await?;
    if report.recent.len() > MAX_REPORTED_REFUSALS {
        return Err(ApiError::bad_request(format!(
            "a report carries at most {MAX_REPORTED_REFUSALS} refusals in recent"
        )));
    }
    let code = |text: &str| {
        ErrorCode::parse(text)
            .ok_or_else(|| ApiError::bad_request(format!("unknown error code {text:?}")))
    };
    let refused = report
        .refused
        .iter()
        .map(|(text, n)| Ok((code(text)?, *n)))
        .collect::<Result<Vec<_>, ApiError>>()?;
    let mut recent = Vec::with_capacity(report.recent.len());
    for refusal in &report.recent {
        lock_name(&refusal.lock)?;
        caller.require(Verb::Write, &refusal.lock)?;
        recent.push((refusal, code(&refusal.code)?));
    }
    let observe = &state.observe;
    observe
        .metrics
        .gate_report(report.resource, report.admitted, &refused);
    let mut answer = GateReportAnswer {
        published: 0,
        dropped: 0,
    };
    for (refusal, code) in recent {
        let published = observe.gate_refused(
            &refusal.lock,
            report.resource,
            code,
            refusal.epoch,
            refusal.high_water,
        );
        if published {
            answer.published += 1;
        } else {
            answer.dropped += 1;
        }
    }
    Ok(Json(answer))
}
