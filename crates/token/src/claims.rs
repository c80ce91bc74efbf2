//! What a token says, and the rules for lock names.

use serde::{Deserialize, Serialize};

/// An ownership generation. Epochs of one lock start at 1 and only grow.
pub type Epoch = u64;

/// Longest holder name accepted in a token (bytes).
pub const MAX_HOLDER_LEN: usize = 256;

/// The signed content of a token.
///
/// Field names are short because they travel in every fenced request; the wire form is
/// compact JSON, decoded strictly.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    /// The lock this token was issued for; it may only write namespace `lock`.
    #[serde(rename = "l")]
    pub lock: String,
    /// The epoch given to this acquisition.
    #[serde(rename = "e")]
    pub epoch: Epoch,
    /// Who acquired the lock: free text chosen by the client without authentication;
    /// with it, the principal's name, optionally followed by `/` and a label.
    #[serde(rename = "h")]
    pub holder: String,
    /// Id of the issuer key that signed the token.
    #[serde(rename = "k")]
    pub key_id: String,
}

/// Whether `holder` names `principal`: the principal's name alone, or the name followed by
/// `/` and a label (`billing`, `billing/worker-1`; not `billing2` nor `other/billing`). The
/// one rule for "this lease or token belongs to this principal", used by the server's
/// authorisation and by the adapters' holder check.
pub fn holder_belongs_to(holder: &str, principal: &str) -> bool {
    match holder.strip_prefix(principal) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

impl Claims {
    /// Checks the claims' own shape: legal lock name, epoch at least 1, bounded holder.
    pub fn check_shape(&self) -> Result<(), &'static str> {
        validate_lock_name(&self.lock).map_err(|_| "illegal lock name")?;
        if self.epoch == 0 {
            return Err("epoch must be at least 1");
        }
        if self.holder.len() > MAX_HOLDER_LEN {
            return Err("holder too long");
        }
        Ok(())
    }
}

/// A lock name that does not match `[A-Za-z0-9._-]{1,128}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lock names are 1 to 128 characters from [A-Za-z0-9._-]")]
pub struct InvalidLockName;

/// Checks a lock name against `[A-Za-z0-9._-]{1,128}`.
///
/// Lock names appear in URLs, token payloads and storage keys; keeping them to this
/// alphabet means none of those needs escaping, and `.`/`..` are refused so a name never
/// looks like a path step.
pub fn validate_lock_name(name: &str) -> Result<(), InvalidLockName> {
    let ok_len = !name.is_empty() && name.len() <= 128;
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok_len && ok_chars && name != "." && name != ".." {
        Ok(())
    } else {
        Err(InvalidLockName)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names() {
        for good in ["a", "orders", "db.primary-1_x", &"x".repeat(128)] {
            assert!(validate_lock_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "é", &"x".repeat(129), "a%2f"] {
            assert!(validate_lock_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_holder_belongs_to_its_principal_and_its_labels_only() {
        for yes in ["billing", "billing/worker-1", "billing/"] {
            assert!(holder_belongs_to(yes, "billing"), "{yes}");
        }
        for no in ["billing2", "billing-x/y", "other/billing", "bill", ""] {
            assert!(!holder_belongs_to(no, "billing"), "{no}");
        }
    }
}
