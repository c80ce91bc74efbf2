//! Shorthands for building histories by hand. Namespace "ns" unless told otherwise.

#![allow(dead_code)]

use palisade_checker::{FinalState, NamespaceState, Op, OpKind};

pub const NS: &str = "ns";

pub fn acquire(process: u64, lock: &str, epoch: u64, start: u64, end: u64) -> Op {
    Op::new(process, OpKind::Acquire, start)
        .lock(lock)
        .epoch(epoch)
        .ok(end)
}

pub fn restart(at: u64) -> Op {
    Op::new(0, OpKind::Restart, at).ok(at)
}

/// An acknowledged write of `value` to `key` with `epoch`, at store revision `rev`.
pub fn write(process: u64, key: &str, value: &str, epoch: u64, span: (u64, u64), rev: u64) -> Op {
    Op::new(process, OpKind::Write, span.0)
        .lock(NS)
        .key(key)
        .value(value)
        .epoch(epoch)
        .revision(rev)
        .ok(span.1)
}

/// A write refused with `stale_token`.
pub fn stale(process: u64, key: &str, value: &str, epoch: u64, span: (u64, u64)) -> Op {
    Op::new(process, OpKind::Write, span.0)
        .lock(NS)
        .key(key)
        .value(value)
        .epoch(epoch)
        .fail(span.1, "stale_token")
}

/// A write whose outcome is unknown.
pub fn unknown(process: u64, key: &str, value: &str, epoch: u64, start: u64) -> Op {
    Op::new(process, OpKind::Write, start)
        .lock(NS)
        .key(key)
        .value(value)
        .epoch(epoch)
        .info()
}

pub fn read(process: u64, key: &str, value: Option<&str>, span: (u64, u64)) -> Op {
    let op = Op::new(process, OpKind::Read, span.0).lock(NS).key(key);
    match value {
        Some(v) => op.value(v).ok(span.1),
        None => op.ok(span.1),
    }
}

pub fn fence(process: u64, epoch: u64, span: (u64, u64)) -> Op {
    Op::new(process, OpKind::Fence, span.0)
        .lock(NS)
        .epoch(epoch)
        .ok(span.1)
}

/// An acknowledged add of `element` to the lock-set `s` of lock `set`.
pub fn add(process: u64, element: &str, epoch: u64, span: (u64, u64), rev: u64) -> Op {
    Op::new(process, OpKind::Add, span.0)
        .lock("set")
        .key("s")
        .value(element)
        .epoch(epoch)
        .revision(rev)
        .ok(span.1)
}

/// Asserts that every report of `check_all` is valid.
pub fn assert_all_valid<'a>(
    reports: impl IntoIterator<Item = &'a (&'static str, palisade_checker::Report)>,
) {
    for (name, report) in reports {
        assert_eq!(
            report.valid,
            palisade_checker::Validity::Valid,
            "{name}: {}",
            report.summary()
        );
    }
}

/// A final state with one namespace.
pub fn final_state(ns: &str, high_water: u64, values: &[(&str, &str)]) -> FinalState {
    let mut state = FinalState::default();
    state.namespaces.insert(
        ns.to_owned(),
        NamespaceState {
            high_water,
            values: values
                .iter()
                .map(|&(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        },
    );
    state
}
