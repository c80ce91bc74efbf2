//! # Auth: identity and permission, the first two of the three checks (S14)
//!
//! Every request that is not public passes, in this order:
//!
//! 1. **Identity** ([`authenticate`], run by the API's middleware before every route): who is
//!    calling. A bearer key (`Authorization: Bearer <key>`) whose SHA-256 an auth file
//!    principal holds, or, with mutual TLS, a verified client certificate whose common
//!    name a principal claims (`cert_cn`). Neither: 401 `unauthenticated` with
//!    `WWW-Authenticate: Bearer`, and nothing runs.
//! 2. **Permission** ([`Caller::require`], called by each handler once it knows the lock):
//!    may this principal use this verb on this lock. No: 403 `permission_denied`.
//! 3. **Ownership** is not decided here but next to what is owned: a lease belongs to the
//!    principal its holder names (`<principal>` or `<principal>/<label>`,
//!    [`Principal::owns_holder`]), and a fenced write needs a token whose holder is the
//!    caller. The handlers check it against the lease or the token's claims.
//!
//! Public routes need no identity: `GET /healthz`, `GET /v1/keys` (public keys are
//! public) and `GET /v1/openapi.json` (the contract is in the repository anyway). The
//! dashboard's files (`/ui`, [`crate::ui`]) never reach this middleware: they are static
//! and hold no data; the page sends a key with each API call it makes.
//!
//! Without an auth file every request is [`Caller::Open`]: everything is allowed, as in a
//! server on loopback before authentication existed. The server refuses to listen on a
//! non-loopback address that way unless told `--insecure-no-auth`.
//!
//! ## What this does not do
//! - It does not make tokens secret or bind them to a connection: a stolen token is still
//!   genuine. With auth on it is only usable by its own principal (the ownership check),
//!   and only until a newer epoch reaches the resource.
//! - It does not encrypt anything: keys cross the network in the clear unless TLS is on.
//! - Keys are compared as SHA-256 digests; the file holds no key, so a leaked auth file
//!   does not let anyone in (a key has 256 bits; the digest cannot be reversed).

mod file;
mod policy;

use palisade_api::ErrorDetail;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::extract::{FromRequestParts, Request};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::request::Parts;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};

use palisade_issuer::{MayAct, Ownership};
use palisade_token::MAX_HOLDER_LEN;

pub use file::{load, parse, valid_principal_name, MAX_PRINCIPAL_LEN};
pub use policy::{key_digest, AuthPolicy, Grant, LockPattern, Principal, PrincipalLimits, Verb};

use crate::audit::Audit;
use crate::audit::AuditEvent;
use crate::error::ApiError;

/// Paths anyone may read without credentials.
const PUBLIC_PATHS: [&str; 3] = ["/healthz", "/v1/keys", "/v1/openapi.json"];

/// The subject of the client certificate a mutual-TLS connection was verified with,
/// found in the extensions of every request on that connection (put there by the TLS
/// layer, [`crate::transport`]). Absent on connections without a client certificate
/// (plain HTTP, or TLS without `--tls-client-ca`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// The certificate subject's first Common Name, if it has one in UTF-8.
    pub common_name: Option<String>,
}

/// The auth file in use, replaceable while serving (SIGHUP).
pub struct Auth {
    path: PathBuf,
    policy: ArcSwap<AuthPolicy>,
    /// Bumped by every reload that took effect, for requests that outlive one.
    reloads: tokio::sync::watch::Sender<u64>,
}

impl Auth {
    /// Loads the auth file.
    pub fn load(path: &Path) -> Result<Auth, String> {
        Ok(Auth {
            path: path.to_owned(),
            policy: ArcSwap::from_pointee(load(path)?),
            reloads: tokio::sync::watch::channel(0).0,
        })
    }

    /// Reads the auth file again; on any error the policy in use stays.
    pub fn reload(&self) -> Result<usize, String> {
        let policy = load(&self.path)?;
        let count = policy.principals().len();
        self.policy.store(Arc::new(policy));
        self.reloads.send_modify(|n| *n += 1);
        Ok(count)
    }

    /// Changes with every reload. A long-lived request (an events stream) watches it and
    /// asks [`Auth::still_grants`] whether its principal still stands as it was.
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// An acquisition waiting in line (`wait_ms`) for `caller`: waits for `acquiring`, but
    /// when a reload takes the principal away (401) or its right to acquire `lock` (403),
    /// stops waiting and says so; dropping `acquiring` withdraws it from the line.
    pub async fn while_granted<T>(
        auth: Option<&Auth>,
        caller: &Caller,
        lock: &str,
        acquiring: impl std::future::Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        let (Some(auth), Caller::Principal(principal)) = (auth, caller) else {
            return acquiring.await;
        };
        let mut reloads = auth.reloads();
        tokio::pin!(acquiring);
        loop {
            tokio::select! {
                biased;
                done = &mut acquiring => return done,
                changed = reloads.changed() => {
                    if changed.is_err() {
                        return acquiring.await;
                    }
                    match auth.current(&principal.name) {
                        None => return Err(unauthenticated(
                            "the auth file no longer has this principal (reloaded while the \
                             acquisition waited)",
                        )),
                        Some(now) => Caller::Principal(now).require(Verb::Acquire, lock)?,
                    }
                }
            }
        }
    }

    /// Whether the policy in use has `principal` exactly as it is: same name, same
    /// credentials, grants and limits. A reload that removed it or changed it (narrowed
    /// its grants, for one) ends what it had open; the client opens it again under what
    /// the file says now.
    pub fn still_grants(&self, principal: &Principal) -> bool {
        self.current(&principal.name)
            .is_some_and(|now| *now == *principal)
    }

    /// The principal named `name` in the policy in use now.
    fn current(&self, name: &str) -> Option<Arc<Principal>> {
        self.policy
            .load()
            .principals()
            .iter()
            .find(|p| p.name == name)
            .cloned()
    }

    pub fn policy(&self) -> Arc<AuthPolicy> {
        self.policy.load_full()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Who is calling, as established by [`authenticate`].
#[derive(Debug, Clone)]
pub enum Caller {
    /// Authentication is off: every verb on every lock, holders as the client names them.
    Open,
    /// An authenticated principal.
    Principal(Arc<Principal>),
}

impl Caller {
    /// The principal's name (None with authentication off).
    pub fn name(&self) -> Option<&str> {
        match self {
            Caller::Open => None,
            Caller::Principal(p) => Some(&p.name),
        }
    }

    pub fn principal(&self) -> Option<&Principal> {
        match self {
            Caller::Open => None,
            Caller::Principal(p) => Some(p),
        }
    }

    /// Whether the caller may use `verb` on `lock`.
    pub fn may(&self, verb: Verb, lock: &str) -> bool {
        match self {
            Caller::Open => true,
            Caller::Principal(p) => p.may(verb, lock),
        }
    }

    /// Whether the caller may use `verb` on at least one lock.
    pub fn may_any(&self, verb: Verb) -> bool {
        match self {
            Caller::Open => true,
            Caller::Principal(p) => p.admin || p.grants.iter().any(|g| g.allows(verb)),
        }
    }

    /// Permission: 403 `permission_denied` unless the caller may use `verb` on `lock`.
    pub fn require(&self, verb: Verb, lock: &str) -> Result<(), ApiError> {
        if self.may(verb, lock) {
            return Ok(());
        }
        Err(self.denied(
            format!("may not {verb} lock {lock:?}"),
            Some(lock),
            Some(verb),
        ))
    }

    /// Whether the caller may act for `holder` (a lease's or a token's): it is the holder's
    /// principal, or an admin, or authentication is off.
    pub fn acts_for(&self, holder: &str) -> bool {
        match self {
            Caller::Open => true,
            Caller::Principal(p) => p.admin || p.owns_holder(holder),
        }
    }

    /// The issuer's check of who acts on a lease (keepalive, release, proclaim), made
    /// with the lease in hand; `None` with authentication off, where anyone may. A lease
    /// it refuses gets [`Caller::lease_refusal`].
    pub fn lease_check(&self) -> MayAct<'_> {
        match self {
            Caller::Open => None,
            Caller::Principal(_) => Some(self),
        }
    }

    /// Why the caller may not act on the lease on `lock` held by `holder`: 403
    /// `permission_denied`, for a lock it may not `acquire` or a holder it does not act
    /// for (audited like every denial).
    pub fn lease_refusal(&self, lock: &str, holder: &str) -> ApiError {
        let refused = self
            .require(Verb::Acquire, lock)
            .and_then(|()| self.require_owner(holder, "this lease", lock));
        // The issuer asked this caller's own check, so one of the two says no; were both
        // to say yes, the answer would still be no, as the issuer gave it.
        refused.err().unwrap_or_else(|| {
            self.denied(
                "this lease belongs to another principal".to_owned(),
                Some(lock),
                None,
            )
        })
    }

    /// Permission for a verb not about one lock (`metrics`): 403 `permission_denied`
    /// unless some grant allows it (any lock pattern), or the caller is an admin.
    pub fn require_any(&self, verb: Verb) -> Result<(), ApiError> {
        if self.may_any(verb) {
            return Ok(());
        }
        Err(self.denied(format!("may not {verb}"), None, Some(verb)))
    }

    /// Ownership: 403 `permission_denied` unless the caller may act for `holder`.
    pub fn require_owner(&self, holder: &str, what: &str, lock: &str) -> Result<(), ApiError> {
        if self.acts_for(holder) {
            return Ok(());
        }
        Err(self.denied(
            format!("{what} belongs to another principal"),
            Some(lock),
            None,
        ))
    }

    /// The holder a grant is recorded under. With authentication off the client names it
    /// (required, as before); otherwise it is the principal's name, followed by
    /// `/<label>` when the client gives a label.
    pub fn holder(&self, requested: Option<String>) -> Result<String, ApiError> {
        let checked = |text: String, what: &str| {
            if text.is_empty() || text.len() > MAX_HOLDER_LEN || text.chars().any(char::is_control)
            {
                Err(ApiError::bad_request(format!(
                    "{what} must be 1 to {MAX_HOLDER_LEN} bytes without control characters"
                )))
            } else {
                Ok(text)
            }
        };
        match (self, requested) {
            (Caller::Open, Some(holder)) => checked(holder, "holder"),
            (Caller::Open, None) => Err(ApiError::bad_request(
                "holder is required when the server runs without authentication",
            )),
            (Caller::Principal(p), None) => Ok(p.name.clone()),
            (Caller::Principal(p), Some(label)) => {
                if label.is_empty() {
                    return Err(ApiError::bad_request("holder (a label) may not be empty"));
                }
                checked(format!("{}/{label}", p.name), "principal/holder")
            }
        }
    }

    fn denied(&self, message: String, lock: Option<&str>, verb: Option<Verb>) -> ApiError {
        let error = ApiError::permission_denied(self.name(), message);
        let mut event = AuditEvent::new("permission_denied").principal(self.name());
        if let Some(lock) = lock {
            event = event.lock(lock);
        }
        if let Some(verb) = verb {
            event = event.detail(verb.as_str());
        }
        error.audited(event)
    }
}

/// A lease may be acted on by a caller who may `acquire` its lock and acts for its holder.
impl Ownership for Caller {
    fn may_act(&self, lock: &str, holder: &str) -> bool {
        self.may(Verb::Acquire, lock) && self.acts_for(holder)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        // Placed by `authenticate` on every route that is not public; missing means a
        // public route asked for a caller, which must not pass as anyone.
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| unauthenticated("this route needs credentials"))
    }
}

fn unauthenticated(message: &str) -> ApiError {
    ApiError::new(ErrorDetail::Unauthenticated, message)
}

/// Identity: establishes the [`Caller`] of every non-public request (placed in its
/// extensions for the [`Caller`] extractor), or answers 401. Called by the API's one
/// middleware (`api/front.rs`) before the route runs; the [`Admitted`] it returns
/// writes, once the route has answered, what the handler marked for the audit log.
pub fn authenticate(
    auth: Option<&Auth>,
    audit: &Audit,
    req: &mut Request,
) -> Result<Admitted, Unidentified> {
    let route = audit.is_on().then(|| req.uri().path().to_owned());
    let caller = match auth {
        None => Some(Caller::Open),
        Some(_) if PUBLIC_PATHS.contains(&req.uri().path()) => None,
        Some(auth) => match identify(&auth.policy.load(), req) {
            Ok(principal) => Some(Caller::Principal(principal)),
            Err(reason) => {
                let mut event = AuditEvent::new("auth_failed").detail(reason);
                event.route = route;
                audit.record(event);
                return Err(Unidentified(reason));
            }
        },
    };
    // Kept only for an audit record the handler may leave in the response.
    let name = route
        .is_some()
        .then(|| caller.as_ref().and_then(|c| c.name().map(str::to_owned)))
        .flatten();
    if let Some(caller) = caller {
        req.extensions_mut().insert(caller);
    }
    Ok(Admitted { route, name })
}

/// Why [`authenticate`] refused a request: its answer is 401 `unauthenticated` with
/// `WWW-Authenticate: Bearer`.
pub struct Unidentified(&'static str);

impl IntoResponse for Unidentified {
    fn into_response(self) -> Response {
        let mut response = unauthenticated(self.0).into_response();
        response.headers_mut().insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"palisade\""),
        );
        response
    }
}

/// A request [`authenticate`] let through: what its audit record needs once it is
/// answered (nothing when the audit log is off).
pub struct Admitted {
    route: Option<String>,
    name: Option<String>,
}

impl Admitted {
    /// The one place that writes what a handler marked for the audit log (an
    /// [`AuditEvent`] in the response's extensions), with the caller's name and the route.
    pub fn finish(self, audit: &Audit, response: &mut Response) {
        if let Some(mut event) = response.extensions_mut().remove::<AuditEvent>() {
            if event.principal.is_none() {
                event.principal = self.name;
            }
            event.route = self.route;
            audit.record(event);
        }
    }
}

/// The principal a request names, or why it names none.
fn identify(policy: &AuthPolicy, req: &Request) -> Result<Arc<Principal>, &'static str> {
    let mut values = req.headers().get_all(AUTHORIZATION).iter();
    match (values.next(), values.next()) {
        (Some(_), Some(_)) => Err("more than one Authorization header"),
        (Some(value), None) => {
            let text = value
                .to_str()
                .map_err(|_| "Authorization is not visible ASCII")?
                .trim();
            let (scheme, key) = text
                .split_once(' ')
                .ok_or("Authorization must be \"Bearer <key>\"")?;
            if !scheme.eq_ignore_ascii_case("bearer") {
                return Err("Authorization must use the Bearer scheme");
            }
            policy.by_key(key.trim()).ok_or("unknown key")
        }
        (None, _) => {
            let cert = req.extensions().get::<ClientCert>();
            match cert.and_then(|c| c.common_name.as_deref()) {
                Some(cn) => policy
                    .by_cert_cn(cn)
                    .ok_or("the client certificate names no principal"),
                None => Err("this server needs a bearer key (Authorization: Bearer <key>)"),
            }
        }
    }
}

/// A fresh bearer key: 256 random bits, base64url, with a recognisable prefix.
pub fn new_key() -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use base64::Engine;
    format!("pal_{}", B64.encode(rand::random::<[u8; 32]>()))
}
