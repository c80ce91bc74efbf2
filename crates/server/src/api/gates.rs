//! `POST /v1/gates/report`: what a gate in another resource (a PostgreSQL table, a Redis,
//! a SQLite file, an object store) admitted and refused, so that refusals at the resource
//! show where operators look: `/metrics` (`palisade_gate_admits_total{resource}`,
//! `palisade_gate_refusals_total{resource,code}`), the events stream (`gate_refused`) and
//! the resource's marks (`GET /v1/gates/marks`, beside the built-in store's).
//!
//! The whole report is checked before anything is taken (every code known, every lock
//! name valid, at most [`MAX_REPORTED_REFUSALS`] refusals and [`MAX_REPORTED_MARKS`]
//! marks, the caller allowed to write each lock it names), so a bad report changes
//! nothing. The counts are always taken; the
//! refusals become events within [`crate::observe::GATE_EVENTS_PER_SECOND`] for all
//! gates together, and the answer says how many were dropped.
//!
//! What it does not do: the server does not check that a report is true. A principal
//! that may write a lock can report refusals for it that never happened; what a report
//! can do is bounded (counters by a fixed set of labels, events at a bounded rate).

use axum::extract::State;
use axum::Json;

use palisade_api::wire::{
    GateReport, GateReportAnswer, LockMarks, LockMarksList, MAX_REPORTED_MARKS,
    MAX_REPORTED_REFUSALS,
};
use palisade_api::ErrorCode;

use super::locks::{page, scans_for, PageQuery};
use super::{listing_permit, lock_name, ApiError, AppState, QueryParams, RequestBody};
use crate::auth::{Caller, Verb};
use crate::observe::events::now_ms;

/// `POST /v1/gates/report`.
pub async fn report(
    State(state): State<AppState>,
    caller: Caller,
    body: RequestBody,
) -> Result<Json<GateReportAnswer>, ApiError> {
    caller.require_any(Verb::Write)?;
    let report: GateReport = body.json().await?;
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
    if report.marks.len() > MAX_REPORTED_MARKS {
        return Err(ApiError::bad_request(format!(
            "a report carries at most {MAX_REPORTED_MARKS} marks"
        )));
    }
    for mark in &report.marks {
        lock_name(&mark.lock)?;
        caller.require(Verb::Write, &mark.lock)?;
    }
    let observe = &state.observe;
    observe
        .metrics
        .gate_report(report.resource, report.admitted, &refused);
    let now = now_ms();
    for mark in &report.marks {
        observe
            .gate_marks
            .report(&mark.lock, report.resource, mark.high_water, now);
    }
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

/// Most locks one page of `GET /v1/gates/marks` holds (each costs a read of the built-in
/// store's mark); 100 unless `limit` asks for fewer.
pub const MAX_MARKS_PAGE: usize = 100;

/// `GET /v1/gates/marks`: the locks some gate reported a mark for, a page at a time in
/// name order, each with the built-in store's mark and the highest each kind of resource
/// reported (what this server heard since it started). With authentication on, only the
/// locks the caller may `read`.
pub async fn marks(
    State(state): State<AppState>,
    caller: Caller,
    QueryParams(query): QueryParams<PageQuery>,
) -> Result<Json<LockMarksList>, ApiError> {
    let _permit = listing_permit(&state).await?;
    let limit = query.limit.unwrap_or(MAX_MARKS_PAGE).min(MAX_MARKS_PAGE);
    let query = PageQuery {
        limit: Some(limit),
        ..query
    };
    let (found, next) = page(
        scans_for(&caller, &query.prefix, &[Verb::Read]),
        &query,
        |(lock, _): &(String, _)| lock.as_str(),
        |page| {
            let found = state.observe.gate_marks.page(&page);
            async move { Ok(found) }
        },
    )
    .await?;
    let mut locks = Vec::with_capacity(found.len());
    for (lock, resources) in found {
        if !caller.may(Verb::Read, &lock) {
            continue;
        }
        let store = state.backend.high_water(&lock).await?.epoch;
        locks.push(LockMarks {
            store: (store > 0).then_some(store),
            lock,
            resources,
        });
    }
    Ok(Json(LockMarksList { locks, next }))
}
