//! Principals, their grants, and the two questions asked of them: who is this key (or
//! certificate), and may this principal use this verb on this lock.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a principal may do to a lock. See docs/security.md for what each covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// Acquire the lock, and keep alive, release and see the lease id of one's own leases.
    Acquire,
    /// Read values, list keys and read the namespace's high-water mark.
    Read,
    /// Fenced put and delete, and the barrier (`POST /v1/fences/{lock}`).
    Write,
    /// Ask whether a token for the lock is genuine and current (`POST /v1/tokens/check`).
    Check,
    /// Read `GET /metrics`. Not about any one lock: a grant's lock pattern does not
    /// matter for it.
    Metrics,
}

impl Verb {
    pub const ALL: [Verb; 5] = [
        Verb::Acquire,
        Verb::Read,
        Verb::Write,
        Verb::Check,
        Verb::Metrics,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Acquire => "acquire",
            Verb::Read => "read",
            Verb::Write => "write",
            Verb::Check => "check",
            Verb::Metrics => "metrics",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }

    pub(crate) fn parse(text: &str) -> Option<Verb> {
        Verb::ALL.into_iter().find(|v| v.as_str() == text)
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The locks a grant covers: one name, or every name with a prefix (`orders*`; `*` alone
/// covers every lock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockPattern {
    Exact(String),
    Prefix(String),
}

impl LockPattern {
    pub fn matches(&self, lock: &str) -> bool {
        match self {
            LockPattern::Exact(name) => name == lock,
            LockPattern::Prefix(prefix) => lock.starts_with(prefix.as_str()),
        }
    }
}

/// A set of verbs on a set of locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub locks: LockPattern,
    verbs: u8,
}

impl Grant {
    pub fn new(locks: LockPattern, verbs: impl IntoIterator<Item = Verb>) -> Grant {
        Grant {
            locks,
            verbs: verbs.into_iter().fold(0, |bits, v| bits | v.bit()),
        }
    }

    pub fn allows(&self, verb: Verb) -> bool {
        self.verbs & verb.bit() != 0
    }
}

/// Limits on one principal; `None` falls back to the server-wide default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrincipalLimits {
    /// Longest lease TTL this principal may ask for.
    pub max_ttl_ms: Option<u64>,
    /// Live leases this principal may hold at once.
    pub max_leases: Option<u32>,
    /// Acquisitions this principal may have waiting in line at once.
    pub max_waiters: Option<u32>,
    /// Events streams this principal may have open at once.
    pub max_event_subscribers: Option<u32>,
}

/// Someone the server knows: by the SHA-256 of a bearer key, by a client certificate's
/// common name, or both.
#[derive(Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub admin: bool,
    pub(crate) key_sha256: Option<[u8; 32]>,
    pub cert_cn: Option<String>,
    pub grants: Vec<Grant>,
    pub limits: PrincipalLimits,
}

impl fmt::Debug for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The digest is not secret, but there is no reason to spread it through logs.
        f.debug_struct("Principal")
            .field("name", &self.name)
            .field("admin", &self.admin)
            .field("cert_cn", &self.cert_cn)
            .field("grants", &self.grants)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Principal {
    /// Whether this principal may use `verb` on `lock`.
    pub fn may(&self, verb: Verb, lock: &str) -> bool {
        self.admin
            || self
                .grants
                .iter()
                .any(|g| g.allows(verb) && g.locks.matches(lock))
    }

    /// The patterns under which this principal may use any of `verbs`: what a listing
    /// has to look at. `None` means every lock (an admin, or a `*` grant).
    pub fn visible_patterns(&self, verbs: &[Verb]) -> Option<Vec<&LockPattern>> {
        if self.admin {
            return None;
        }
        let mut patterns = Vec::new();
        for grant in &self.grants {
            if !verbs.iter().any(|v| grant.allows(*v)) {
                continue;
            }
            if grant.locks == LockPattern::Prefix(String::new()) {
                return None;
            }
            patterns.push(&grant.locks);
        }
        Some(patterns)
    }

    /// Whether a token or lease holder names this principal: the holder is the
    /// principal's name alone, or the name followed by `/` and a label.
    pub fn owns_holder(&self, holder: &str) -> bool {
        palisade_token::holder_belongs_to(holder, &self.name)
    }
}

/// The SHA-256 of a bearer key, as the auth file stores it.
pub fn key_digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Everyone the server knows, loaded from the auth file.
#[derive(Debug, Clone, Default)]
pub struct AuthPolicy {
    principals: Vec<Arc<Principal>>,
    /// Principals by the SHA-256 of their key.
    by_digest: HashMap<[u8; 32], Arc<Principal>>,
}

impl AuthPolicy {
    pub(crate) fn new(principals: Vec<Principal>) -> AuthPolicy {
        let principals: Vec<Arc<Principal>> = principals.into_iter().map(Arc::new).collect();
        let by_digest = principals
            .iter()
            .filter_map(|p| p.key_sha256.map(|d| (d, p.clone())))
            .collect();
        AuthPolicy {
            principals,
            by_digest,
        }
    }

    /// The principal whose key this is.
    ///
    /// Keys are never compared as such: the presented key is hashed (SHA-256) and the
    /// digest looked up. How long the lookup takes can only depend on the digest, which
    /// whoever guesses a key cannot steer towards a stored one (that would need a
    /// preimage), so timing says nothing about how close a guess came. The final
    /// comparison of the two digests is constant-time anyway. One hash and one lookup,
    /// however many principals the file has (`auth/by_key_*` in crates/bench/benches).
    pub fn by_key(&self, key: &str) -> Option<Arc<Principal>> {
        let digest = key_digest(key);
        let found = self.by_digest.get(&digest)?;
        let stored = found.key_sha256.as_ref()?;
        bool::from(stored.ct_eq(&digest)).then(|| found.clone())
    }

    /// The principal named by a verified client certificate's common name.
    pub fn by_cert_cn(&self, common_name: &str) -> Option<Arc<Principal>> {
        self.principals
            .iter()
            .find(|p| p.cert_cn.as_deref() == Some(common_name))
            .cloned()
    }

    pub fn principals(&self) -> &[Arc<Principal>] {
        &self.principals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(name: &str, grants: Vec<Grant>) -> Principal {
        Principal {
            name: name.into(),
            admin: false,
            key_sha256: Some(key_digest(&format!("key-of-{name}"))),
            cert_cn: None,
            grants,
            limits: PrincipalLimits::default(),
        }
    }

    #[test]
    fn grants_match_exact_names_and_prefixes() {
        let p = principal(
            "billing",
            vec![
                Grant::new(LockPattern::Prefix("orders".into()), [Verb::Acquire]),
                Grant::new(LockPattern::Exact("ledger".into()), [Verb::Read]),
            ],
        );
        assert!(p.may(Verb::Acquire, "orders"));
        assert!(p.may(Verb::Acquire, "orders.eu"));
        assert!(!p.may(Verb::Write, "orders"));
        assert!(p.may(Verb::Read, "ledger"));
        assert!(!p.may(Verb::Read, "ledger2"));
        assert!(!p.may(Verb::Acquire, "other"));
        let admin = Principal {
            admin: true,
            ..principal("root", vec![])
        };
        assert!(Verb::ALL.iter().all(|v| admin.may(*v, "anything")));
    }

    #[test]
    fn holders_belong_to_their_principal_only() {
        let p = principal("billing", vec![]);
        assert!(p.owns_holder("billing"));
        assert!(p.owns_holder("billing/worker-1"));
        assert!(!p.owns_holder("billing2"));
        assert!(!p.owns_holder("billing-x/y"));
        assert!(!p.owns_holder("other/billing"));
    }

    #[test]
    fn keys_find_their_principal_and_nothing_else() {
        let policy = AuthPolicy::new(vec![principal("a", vec![]), principal("b", vec![])]);
        assert_eq!(policy.by_key("key-of-b").unwrap().name, "b");
        assert!(policy.by_key("key-of-c").is_none());
        assert!(policy.by_key("").is_none());
    }

    #[test]
    fn the_metrics_verb_is_granted_by_any_pattern_and_only_by_itself() {
        let reader = principal(
            "prom",
            vec![Grant::new(
                LockPattern::Exact("unused".into()),
                [Verb::Metrics],
            )],
        );
        let caller = crate::auth::Caller::Principal(Arc::new(reader.clone()));
        assert!(caller.may_any(Verb::Metrics));
        assert!(!caller.may_any(Verb::Read) && !caller.may_any(Verb::Acquire));
        let worker = principal(
            "w",
            vec![Grant::new(
                LockPattern::Prefix(String::new()),
                [Verb::Acquire, Verb::Read, Verb::Write, Verb::Check],
            )],
        );
        let worker = crate::auth::Caller::Principal(Arc::new(worker));
        assert!(!worker.may_any(Verb::Metrics));
        let admin = Principal {
            admin: true,
            ..principal("root", vec![])
        };
        assert!(crate::auth::Caller::Principal(Arc::new(admin)).may_any(Verb::Metrics));
        assert!(crate::auth::Caller::Open.may_any(Verb::Metrics));
        assert_eq!(Verb::parse("metrics"), Some(Verb::Metrics));
    }

    #[test]
    fn visible_patterns_follow_the_verbs() {
        let p = principal(
            "p",
            vec![
                Grant::new(LockPattern::Prefix("a".into()), [Verb::Read]),
                Grant::new(LockPattern::Exact("b".into()), [Verb::Write]),
            ],
        );
        let seen = p.visible_patterns(&[Verb::Acquire, Verb::Read]).unwrap();
        assert_eq!(seen, vec![&LockPattern::Prefix("a".into())]);
        let everything = principal(
            "q",
            vec![Grant::new(LockPattern::Prefix(String::new()), [Verb::Read])],
        );
        assert!(everything.visible_patterns(&[Verb::Read]).is_none());
    }
}
