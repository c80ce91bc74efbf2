//! The final state: what the store held after the run, read once every worker stopped.
//!
//! Stored as one JSON object:
//! `{"namespaces": {"<lock>": {"high_water": 3, "values": {"<key>": "<value>"}}}}`.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::history::{Epoch, HistoryError};

/// What the store held at the end of the run, read after every worker had stopped.
///
/// A namespace missing from `namespaces` was *not recorded*; checkers that need it report
/// `Unknown` rather than assume it empty. Record an unused or empty namespace as `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalState {
    #[serde(default)]
    pub namespaces: BTreeMap<String, NamespaceState>,
}

/// One namespace's final high-water mark and contents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceState {
    #[serde(default)]
    pub high_water: Epoch,
    #[serde(default)]
    pub values: BTreeMap<String, String>,
}

impl FinalState {
    pub fn from_json(reader: impl Read) -> Result<FinalState, HistoryError> {
        serde_json::from_reader(reader).map_err(|source| HistoryError::Json { line: 1, source })
    }

    pub fn to_json(&self, writer: impl Write) -> Result<(), HistoryError> {
        serde_json::to_writer(writer, self).map_err(|source| HistoryError::Json { line: 1, source })
    }
}
