//! The auth file (`palisade serve --auth-file FILE`): TOML, read at start and on SIGHUP.
//!
//! ```toml
//! [[principal]]
//! name = "billing"                  # [A-Za-z0-9._-]{1,64}
//! key_sha256 = "<64 hex chars>"     # SHA-256 of the bearer key; the key is never stored
//! cert_cn = "billing.internal"      # optional: or a client certificate with this CN
//! admin = false                     # optional; an admin may do everything, on every lock
//! max_ttl_ms = 60000                # optional limits; the server's defaults otherwise
//! max_leases = 100
//! max_waiters = 100
//! max_event_subscribers = 4         # events streams open at once
//! [[principal.grant]]
//! locks = "orders*"                 # an exact lock name, or a prefix ending in '*'
//! allow = ["acquire", "read", "write", "check"]   # and "metrics" (GET /metrics)
//! ```
//!
//! Everything is checked before the file is used: an unknown field, a malformed name,
//! digest or pattern, an unknown verb, two principals with one name, key or certificate
//! name, or a principal nobody could ever authenticate as, each refuses the whole file
//! with a message naming the principal. A server never runs on half of an auth file.

use std::collections::HashSet;
use std::path::Path;

use serde::Deserialize;

use super::policy::{AuthPolicy, Grant, LockPattern, Principal, PrincipalLimits, Verb};

/// Longest principal name.
pub const MAX_PRINCIPAL_LEN: usize = 64;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    #[serde(default)]
    principal: Vec<PrincipalDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalDoc {
    name: String,
    key_sha256: Option<String>,
    cert_cn: Option<String>,
    #[serde(default)]
    admin: bool,
    #[serde(default)]
    grant: Vec<GrantDoc>,
    max_ttl_ms: Option<u64>,
    max_leases: Option<u32>,
    max_waiters: Option<u32>,
    max_event_subscribers: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantDoc {
    locks: String,
    allow: Vec<String>,
}

/// Reads and checks an auth file.
pub fn load(path: &Path) -> Result<AuthPolicy, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read auth file {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("auth file {}: {e}", path.display()))
}

/// Checks the text of an auth file.
pub fn parse(text: &str) -> Result<AuthPolicy, String> {
    let doc: FileDoc = toml::from_str(text).map_err(|e| e.to_string())?;
    if doc.principal.is_empty() {
        return Err("no [[principal]]: every request would be refused".to_owned());
    }
    let mut names = HashSet::new();
    let mut digests = HashSet::new();
    let mut cert_names = HashSet::new();
    let mut principals = Vec::with_capacity(doc.principal.len());
    for p in doc.principal {
        let principal = principal(p).map_err(|(name, e)| format!("principal {name:?}: {e}"))?;
        let name = principal.name.clone();
        if !names.insert(name.clone()) {
            return Err(format!("principal {name:?} is defined twice"));
        }
        if let Some(d) = principal.key_sha256 {
            if !digests.insert(d) {
                return Err(format!(
                    "principal {name:?}: key_sha256 is also another principal's"
                ));
            }
        }
        if let Some(cn) = &principal.cert_cn {
            if !cert_names.insert(cn.clone()) {
                return Err(format!(
                    "principal {name:?}: cert_cn {cn:?} is also another principal's"
                ));
            }
        }
        principals.push(principal);
    }
    Ok(AuthPolicy::new(principals))
}

fn principal(doc: PrincipalDoc) -> Result<Principal, (String, String)> {
    let name = doc.name;
    let fail = |e: String| (name.clone(), e);
    if !valid_principal_name(&name) {
        return Err(fail(format!(
            "name must be 1 to {MAX_PRINCIPAL_LEN} of [A-Za-z0-9._-]"
        )));
    }
    let key_sha256 = doc
        .key_sha256
        .as_deref()
        .map(|hex_text| {
            let bytes = hex::decode(hex_text.trim()).ok();
            bytes
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .ok_or_else(|| "key_sha256 must be 64 hex characters".to_owned())
        })
        .transpose()
        .map_err(fail)?;
    if let Some(cn) = &doc.cert_cn {
        if cn.is_empty() || cn.len() > 256 || cn.chars().any(char::is_control) {
            return Err(fail(
                "cert_cn must be 1 to 256 bytes without control characters".to_owned(),
            ));
        }
    }
    if key_sha256.is_none() && doc.cert_cn.is_none() {
        return Err(fail(
            "needs key_sha256 or cert_cn: nobody could authenticate as it".to_owned(),
        ));
    }
    let mut grants = Vec::with_capacity(doc.grant.len());
    for g in doc.grant {
        grants.push(grant(g).map_err(&fail)?);
    }
    if doc.max_ttl_ms == Some(0) || doc.max_leases == Some(0) && doc.max_waiters == Some(0) {
        // Zero leases with zero waiters, or a zero TTL, is a principal that can do nothing
        // with locks: almost certainly a typo. A zero for one of the two counts is allowed.
        return Err(fail(
            "max_ttl_ms must be positive, and max_leases and max_waiters not both 0".to_owned(),
        ));
    }
    Ok(Principal {
        name,
        admin: doc.admin,
        key_sha256,
        cert_cn: doc.cert_cn,
        grants,
        limits: PrincipalLimits {
            max_ttl_ms: doc.max_ttl_ms,
            max_leases: doc.max_leases,
            max_waiters: doc.max_waiters,
            max_event_subscribers: doc.max_event_subscribers,
        },
    })
}

fn grant(doc: GrantDoc) -> Result<Grant, String> {
    let locks = match doc.locks.strip_suffix('*') {
        Some(prefix) => {
            let legal = prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if !legal || prefix.len() > 128 {
                return Err(format!(
                    "grant locks {:?}: a prefix uses only the characters of lock names",
                    doc.locks
                ));
            }
            LockPattern::Prefix(prefix.to_owned())
        }
        None => {
            palisade_token::validate_lock_name(&doc.locks)
                .map_err(|e| format!("grant locks {:?}: {e}", doc.locks))?;
            LockPattern::Exact(doc.locks)
        }
    };
    if doc.allow.is_empty() {
        return Err("a grant needs at least one verb in allow".to_owned());
    }
    let mut verbs = Vec::with_capacity(doc.allow.len());
    for verb in &doc.allow {
        verbs.push(Verb::parse(verb).ok_or_else(|| {
            format!("unknown verb {verb:?} (known: acquire, read, write, check, metrics)")
        })?);
    }
    Ok(Grant::new(locks, verbs))
}

/// `[A-Za-z0-9._-]{1,64}`.
pub fn valid_principal_name(name: &str) -> bool {
    (1..=MAX_PRINCIPAL_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::policy::key_digest;

    fn digest_hex(key: &str) -> String {
        hex::encode(key_digest(key))
    }

    #[test]
    fn the_documented_shape_loads() {
        let text = format!(
            r#"
[[principal]]
name = "billing"
key_sha256 = "{}"
admin = false
[[principal.grant]]
locks = "orders*"
allow = ["acquire", "read", "write", "check"]

[[principal]]
name = "ops"
key_sha256 = "{}"
admin = true
"#,
            digest_hex("k1"),
            digest_hex("k2")
        );
        let policy = parse(&text).unwrap();
        let billing = policy.by_key("k1").unwrap();
        assert_eq!(billing.name, "billing");
        assert!(billing.may(Verb::Write, "orders-7"));
        assert!(!billing.may(Verb::Read, "payroll"));
        assert!(policy.by_key("k2").unwrap().admin);
    }

    #[test]
    fn every_mistake_refuses_the_whole_file_by_name() {
        let d = digest_hex("k");
        let cases = [
            ("", "no [[principal]]"),
            (
                &format!("[[principal]]\nname = \"a b\"\nkey_sha256 = \"{d}\""),
                "name must be",
            ),
            ("[[principal]]\nname = \"a\"\nkey_sha256 = \"abc\"", "64 hex"),
            ("[[principal]]\nname = \"a\"", "needs key_sha256 or cert_cn"),
            (
                &format!("[[principal]]\nname = \"a\"\nkey_sha256 = \"{d}\"\nsecret = 1"),
                "unknown field",
            ),
            (
                &format!("[[principal]]\nname = \"a\"\nkey_sha256 = \"{d}\"\n[[principal]]\nname = \"a\"\ncert_cn = \"x\""),
                "defined twice",
            ),
            (
                &format!("[[principal]]\nname = \"a\"\nkey_sha256 = \"{d}\"\n[[principal]]\nname = \"b\"\nkey_sha256 = \"{d}\""),
                "also another principal's",
            ),
            (
                &format!("[[principal]]\nname = \"a\"\nkey_sha256 = \"{d}\"\n[[principal.grant]]\nlocks = \"x\"\nallow = [\"delete\"]"),
                "unknown verb",
            ),
            (
                &format!("[[principal]]\nname = \"a\"\nkey_sha256 = \"{d}\"\n[[principal.grant]]\nlocks = \"a/b*\"\nallow = [\"read\"]"),
                "prefix uses only",
            ),
            (
                &format!("[[principal]]\nname = \"a\"\nkey_sha256 = \"{d}\"\n[[principal.grant]]\nlocks = \"a b\"\nallow = [\"read\"]"),
                "grant locks",
            ),
            (
                &format!("[[principal]]\nname = \"a\"\nkey_sha256 = \"{d}\"\n[[principal.grant]]\nlocks = \"x\"\nallow = []"),
                "at least one verb",
            ),
            (
                &format!("[[principal]]\nname = \"a\"\nkey_sha256 = \"{d}\"\nmax_ttl_ms = 0"),
                "max_ttl_ms must be positive",
            ),
        ];
        for (text, wanted) in cases {
            let err = parse(text).unwrap_err();
            assert!(err.contains(wanted), "{text:?}: {err}");
        }
    }

    #[test]
    fn star_alone_covers_every_lock() {
        let text = "[[principal]]\nname = \"r\"\ncert_cn = \"reader\"\n[[principal.grant]]\nlocks = \"*\"\nallow = [\"read\"]\n";
        let policy = parse(text).unwrap();
        let reader = policy.by_cert_cn("reader").unwrap();
        assert!(reader.may(Verb::Read, "anything"));
        assert!(!reader.may(Verb::Write, "anything"));
        assert!(policy.by_key("").is_none());
    }
}
