//! The commands of the RESP listener, each parsed from its arguments and then run through
//! the very function its HTTP route runs (`crate::api`): one order of checks, one set of
//! error codes, one audit and metrics record, whichever protocol carried the request.

use palisade_api::ErrorDetail;
use std::time::Instant;

use bytes::Bytes;
use palisade_api::wire::{self, KeepaliveInfo, Lease, Released};
use palisade_storage::{Applied, Precondition};

use super::codec::Reply;
use crate::api::{self, ApiError, AppState};
use crate::audit::AuditEvent;
use crate::auth::Caller;
use crate::auth::ClientCert;

/// One connection's state: the protocol it asked for and the credentials it gave.
pub(crate) struct Session {
    resp3: bool,
    /// The key given with `AUTH` or `HELLO ... AUTH`; looked up again for every command,
    /// so that a reload of the auth file applies to open connections at once, as it does
    /// to HTTP requests.
    key: Option<String>,
    cert: Option<ClientCert>,
    /// Set by `QUIT`: answer, then close.
    pub(crate) closing: bool,
}

/// The commands, by name (any case).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Hello,
    Auth,
    Ping,
    Quit,
    Select,
    Client,
    Acquire,
    Keepalive,
    Release,
    Get,
    Put,
    Del,
}

impl Command {
    fn parse(name: &[u8]) -> Option<Command> {
        const NAMES: [(&str, Command); 12] = [
            ("HELLO", Command::Hello),
            ("AUTH", Command::Auth),
            ("PING", Command::Ping),
            ("QUIT", Command::Quit),
            ("SELECT", Command::Select),
            ("CLIENT", Command::Client),
            ("LOCK.ACQUIRE", Command::Acquire),
            ("LOCK.KEEPALIVE", Command::Keepalive),
            ("LOCK.RELEASE", Command::Release),
            ("KV.GET", Command::Get),
            ("KV.PUT", Command::Put),
            ("KV.DEL", Command::Del),
        ];
        NAMES
            .iter()
            .find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name))
            .map(|&(_, c)| c)
    }

    /// The route label of its metrics and audit lines.
    fn route(self) -> &'static str {
        match self {
            Command::Hello => "RESP HELLO",
            Command::Auth => "RESP AUTH",
            Command::Ping => "RESP PING",
            Command::Quit => "RESP QUIT",
            Command::Select => "RESP SELECT",
            Command::Client => "RESP CLIENT",
            Command::Acquire => "RESP LOCK.ACQUIRE",
            Command::Keepalive => "RESP LOCK.KEEPALIVE",
            Command::Release => "RESP LOCK.RELEASE",
            Command::Get => "RESP KV.GET",
            Command::Put => "RESP KV.PUT",
            Command::Del => "RESP KV.DEL",
        }
    }

    /// How it is called, for the answer to a call with the wrong arguments.
    fn usage(self) -> &'static str {
        match self {
            Command::Hello => "HELLO [2|3 [AUTH <principal> <key>] [SETNAME <name>]]",
            Command::Auth => "AUTH [<principal>] <key>",
            Command::Ping => "PING [<message>]",
            Command::Quit => "QUIT",
            Command::Select => "SELECT 0",
            Command::Client => "CLIENT SETNAME <name> | CLIENT SETINFO <attr> <value>",
            Command::Acquire => {
                "LOCK.ACQUIRE <lock> <ttl_ms> [HOLDER <holder>] [WAIT <ms>] [DELAY <ms>]"
            }
            Command::Keepalive => "LOCK.KEEPALIVE <lease_id>",
            Command::Release => "LOCK.RELEASE <lease_id>",
            Command::Get => "KV.GET <lock> <key>",
            Command::Put => {
                "KV.PUT <lock> <key> <value> <token> [SEQ <n>] [IDEMPOTENCY-KEY <k>] \
                 [IF-REVISION <r> | IF-ABSENT]"
            }
            Command::Del => {
                "KV.DEL <lock> <key> <token> [SEQ <n>] [IDEMPOTENCY-KEY <k>] \
                 [IF-REVISION <r> | IF-ABSENT]"
            }
        }
    }
}

impl Session {
    pub(crate) fn new(cert: Option<ClientCert>) -> Session {
        Session {
            resp3: false,
            key: None,
            cert,
            closing: false,
        }
    }

    /// Whether replies are RESP3 (after `HELLO 3`).
    pub(crate) fn resp3(&self) -> bool {
        self.resp3
    }

    /// Runs one command and returns its reply; errors are replies too (`-CODE message`).
    pub(crate) async fn execute(&mut self, state: &AppState, args: Vec<Bytes>) -> Reply {
        let started = Instant::now();
        let Some(command) = Command::parse(&args[0]) else {
            state
                .observe
                .metrics
                .request("RESP unknown", started.elapsed());
            return error_reply(ApiError::bad_request(format!(
                "unknown command {:?}",
                String::from_utf8_lossy(&args[0][..args[0].len().min(64)])
            )));
        };
        let result = self.run(state, command, Args::new(args)).await;
        state
            .observe
            .metrics
            .request(command.route(), started.elapsed());
        match result {
            Ok(reply) => reply,
            Err(mut e) => {
                if let Some(mut event) = e.take_audit() {
                    event.route = Some(command.route().to_owned());
                    state.audit.record(event);
                }
                error_reply(e)
            }
        }
    }

    async fn run(
        &mut self,
        state: &AppState,
        command: Command,
        mut args: Args,
    ) -> Result<Reply, ApiError> {
        let usage =
            || ApiError::bad_request(format!("wrong arguments; usage: {}", command.usage()));
        match command {
            Command::Hello => self.hello(state, args, usage),
            Command::Auth => {
                let (principal, key) = match args.left() {
                    1 => (None, args.text(usage)?),
                    2 => (Some(args.text(usage)?), args.text(usage)?),
                    _ => return Err(usage()),
                };
                self.authenticate(state, principal, key)?;
                Ok(Reply::Status("OK"))
            }
            Command::Ping => match args.left() {
                0 => Ok(Reply::Status("PONG")),
                1 => Ok(Reply::Bulk(args.bytes(usage)?)),
                _ => Err(usage()),
            },
            Command::Quit => {
                self.closing = true;
                Ok(Reply::Status("OK"))
            }
            Command::Select => match (args.left(), args.text(usage)?.as_str()) {
                (1, "0") => Ok(Reply::Status("OK")),
                _ => Err(ApiError::bad_request("there is only database 0")),
            },
            Command::Client => {
                let sub = args.text(usage)?.to_ascii_uppercase();
                match (sub.as_str(), args.left()) {
                    ("SETNAME", 1) | ("SETINFO", 2) => Ok(Reply::Status("OK")),
                    _ => Err(usage()),
                }
            }
            Command::Acquire => {
                let caller = self.caller(state)?;
                let lock = args.text(usage)?;
                let request = acquire_request(&mut args, usage);
                let lease = api::locks::grant(state, &caller, lock, async { request }).await?;
                Ok(lease_reply(lease))
            }
            Command::Keepalive => {
                let caller = self.caller(state)?;
                let lease_id = args.last_text(usage)?;
                let info = api::locks::renew(state, &caller, &lease_id).await?;
                Ok(keepalive_reply(info))
            }
            Command::Release => {
                let caller = self.caller(state)?;
                let lease_id = args.last_text(usage)?;
                let released = api::locks::give_up(state, &caller, &lease_id).await?;
                Ok(released_reply(released))
            }
            Command::Get => {
                let caller = self.caller(state)?;
                // Read in place: a read allocates no copy of its names.
                let lock = args.bytes(usage)?;
                let key = args.bytes(usage)?;
                if args.left() > 0 {
                    return Err(usage());
                }
                let entry = api::kv::read(state, &caller, utf8(&lock)?, utf8(&key)?).await?;
                Ok(entry.map_or(Reply::Null, |e| Reply::Bulk(e.value)))
            }
            Command::Put | Command::Del => {
                let caller = self.caller(state)?;
                let lock = args.text(usage)?;
                let key = args.text(usage)?;
                let value = match command {
                    Command::Put => Some(args.bytes(usage)?),
                    _ => None,
                };
                let fencing = FencingArgs::parse(&mut args, usage)?;
                let limit = state.max_value_bytes;
                let value = value.map(|v| async move {
                    if v.len() > limit {
                        return Err(ApiError::payload_too_large(limit));
                    }
                    Ok(v)
                });
                let applied = api::kv::change(state, &caller, lock, key, &fencing, value).await?;
                Ok(written_reply(applied))
            }
        }
    }

    /// `HELLO [protover [AUTH principal key] [SETNAME name]]`: switches the protocol and
    /// answers in the new one.
    fn hello(
        &mut self,
        state: &AppState,
        mut args: Args,
        usage: impl Fn() -> ApiError + Copy,
    ) -> Result<Reply, ApiError> {
        let mut resp3 = self.resp3;
        if args.left() > 0 {
            resp3 = match args.text(usage)?.as_str() {
                "2" => false,
                "3" => true,
                _ => {
                    return Err(ApiError::new(
                        ErrorDetail::BadRequest,
                        "unsupported protocol version: 2 or 3",
                    ))
                }
            };
        }
        while args.left() > 0 {
            match args.text(usage)?.to_ascii_uppercase().as_str() {
                "AUTH" => {
                    let principal = args.text(usage)?;
                    let key = args.text(usage)?;
                    self.authenticate(state, Some(principal), key)?;
                }
                "SETNAME" => {
                    args.text(usage)?;
                }
                _ => return Err(usage()),
            }
        }
        self.resp3 = resp3;
        Ok(Reply::Map(vec![
            ("server".into(), Reply::text("palisade")),
            ("version".into(), Reply::text(env!("CARGO_PKG_VERSION"))),
            ("proto".into(), Reply::Int(if resp3 { 3 } else { 2 })),
            ("id".into(), Reply::Int(0)),
            ("mode".into(), Reply::text("standalone")),
            ("role".into(), Reply::text("master")),
            ("modules".into(), Reply::Array(Vec::new())),
        ]))
    }

    /// `AUTH`: the key must name a principal of the auth file, and `principal`, when given
    /// (`default` counts as not given, as Redis clients send it), must be its name. A
    /// refused `AUTH` leaves the connection without credentials. Without an auth file
    /// every key is accepted, as the HTTP API ignores `Authorization` then.
    fn authenticate(
        &mut self,
        state: &AppState,
        principal: Option<String>,
        key: String,
    ) -> Result<(), ApiError> {
        let Some(auth) = &state.auth else {
            return Ok(());
        };
        self.key = None;
        let found = auth.policy().by_key(&key);
        let refusal = match (&found, principal.as_deref()) {
            (None, _) => Some("unknown key"),
            (Some(p), Some(name)) if name != "default" && name != p.name => {
                Some("the key is not this principal's")
            }
            _ => None,
        };
        if let Some(reason) = refusal {
            let mut event = AuditEvent::new("auth_failed").detail(reason);
            event.route = Some(Command::Auth.route().to_owned());
            state.audit.record(event);
            return Err(ApiError::new(ErrorDetail::Unauthenticated, reason));
        }
        self.key = Some(key);
        Ok(())
    }

    /// Who is calling: the principal of the key given with `AUTH` (looked up in the auth
    /// file in use now), else that of the client certificate, else nobody (401).
    fn caller(&self, state: &AppState) -> Result<Caller, ApiError> {
        let Some(auth) = &state.auth else {
            return Ok(Caller::Open);
        };
        let policy = auth.policy();
        let found = match (&self.key, &self.cert) {
            (Some(key), _) => policy
                .by_key(key)
                .ok_or("the key given with AUTH is no longer in the auth file (it was reloaded)"),
            (None, Some(cert)) => cert
                .common_name
                .as_deref()
                .and_then(|cn| policy.by_cert_cn(cn))
                .ok_or("the client certificate names no principal"),
            (None, None) => {
                Err("this server needs a key: AUTH <key>, or HELLO 3 AUTH <principal> <key>")
            }
        };
        found
            .map(Caller::Principal)
            .map_err(|reason| ApiError::new(ErrorDetail::Unauthenticated, reason))
    }
}

/// An error as a reply: the stable code in capitals, the message, then the error's extra
/// fields as `name=value`.
pub(crate) fn error_reply(e: ApiError) -> Reply {
    let mut message = e.message().to_owned();
    for (name, value) in e.detail().fields() {
        match value {
            serde_json::Value::String(s) => message.push_str(&format!(" {name}={s}")),
            other => message.push_str(&format!(" {name}={other}")),
        }
    }
    Reply::Error {
        code: e.code().as_str().to_ascii_uppercase(),
        message,
    }
}

/// A command's arguments after its name, taken in order.
struct Args {
    items: std::vec::IntoIter<Bytes>,
}

impl Args {
    fn new(args: Vec<Bytes>) -> Args {
        let mut items = args.into_iter();
        items.next();
        Args { items }
    }

    fn left(&self) -> usize {
        self.items.len()
    }

    fn bytes(&mut self, usage: impl Fn() -> ApiError) -> Result<Bytes, ApiError> {
        self.items.next().ok_or_else(usage)
    }

    /// The next argument as text (names, keys, tokens and numbers are UTF-8).
    fn text(&mut self, usage: impl Fn() -> ApiError) -> Result<String, ApiError> {
        let bytes = self.bytes(usage)?;
        utf8(&bytes).map(str::to_owned)
    }

    /// The next argument as text, which must be the last one.
    fn last_text(&mut self, usage: impl Fn() -> ApiError) -> Result<String, ApiError> {
        let text = self.text(&usage)?;
        if self.left() > 0 {
            return Err(usage());
        }
        Ok(text)
    }

    /// The next argument as an unsigned integer; `what` names it in the refusal.
    fn number(&mut self, what: &str, usage: impl Fn() -> ApiError) -> Result<u64, ApiError> {
        self.text(usage)?
            .parse()
            .map_err(|_| ApiError::bad_request(format!("{what} must be an unsigned integer")))
    }
}

/// An argument other than a value as text.
fn utf8(bytes: &Bytes) -> Result<&str, ApiError> {
    std::str::from_utf8(bytes)
        .map_err(|_| ApiError::bad_request("arguments other than values must be UTF-8"))
}

/// `<ttl_ms> [HOLDER <holder>] [WAIT <ms>] [DELAY <ms>]` as the HTTP route's body.
fn acquire_request(
    args: &mut Args,
    usage: impl Fn() -> ApiError + Copy,
) -> Result<wire::AcquireRequest, ApiError> {
    let mut request = wire::AcquireRequest {
        ttl_ms: Some(args.number("ttl_ms", usage)?),
        ..Default::default()
    };
    while args.left() > 0 {
        match args.text(usage)?.to_ascii_uppercase().as_str() {
            "HOLDER" => request.holder = Some(args.text(usage)?),
            "WAIT" => request.wait_ms = args.number("WAIT", usage)?,
            "DELAY" => request.lock_delay_ms = Some(args.number("DELAY", usage)?),
            _ => return Err(usage()),
        }
    }
    Ok(request)
}

/// The fencing of `KV.PUT` and `KV.DEL`: `<token> [SEQ <n>] [IDEMPOTENCY-KEY <k>]
/// [IF-REVISION <r> | IF-ABSENT]`, checked by the same code as the HTTP headers.
struct FencingArgs {
    token: String,
    seq: Option<String>,
    idempotency_key: Option<String>,
    precondition: Result<Precondition, String>,
}

impl FencingArgs {
    fn parse(
        args: &mut Args,
        usage: impl Fn() -> ApiError + Copy,
    ) -> Result<FencingArgs, ApiError> {
        let mut f = FencingArgs {
            token: args.text(usage)?,
            seq: None,
            idempotency_key: None,
            precondition: Ok(Precondition::None),
        };
        let mut preconditions = 0;
        while args.left() > 0 {
            match args.text(usage)?.to_ascii_uppercase().as_str() {
                "SEQ" => f.seq = Some(args.text(usage)?),
                "IDEMPOTENCY-KEY" => f.idempotency_key = Some(args.text(usage)?),
                "IF-REVISION" => {
                    preconditions += 1;
                    f.precondition = args
                        .text(usage)?
                        .parse()
                        .map(Precondition::Revision)
                        .map_err(|_| "IF-REVISION must be a revision number".to_owned());
                }
                "IF-ABSENT" => {
                    preconditions += 1;
                    f.precondition = Ok(Precondition::Absent);
                }
                _ => return Err(usage()),
            }
        }
        if preconditions > 1 {
            f.precondition = Err("use IF-REVISION or IF-ABSENT, not both".to_owned());
        }
        Ok(f)
    }
}

impl api::kv::MutationArgs for FencingArgs {
    fn token(&self) -> Result<Option<&str>, ApiError> {
        Ok(Some(self.token.trim()))
    }

    fn seq(&self) -> Result<Option<&str>, ApiError> {
        Ok(self.seq.as_deref())
    }

    fn idempotency_key(&self) -> Result<Option<&str>, ApiError> {
        Ok(self.idempotency_key.as_deref())
    }

    fn precondition(&self) -> Result<Precondition, ApiError> {
        self.precondition.clone().map_err(ApiError::bad_request)
    }
}

fn field(name: &str, value: Reply) -> (String, Reply) {
    (name.to_owned(), value)
}

fn int(n: u64) -> Reply {
    i64::try_from(n).map_or_else(|_| Reply::text(n.to_string()), Reply::Int)
}

/// The fields of the HTTP route's JSON answer, in its order (`value` as raw bytes).
fn lease_reply(l: Lease) -> Reply {
    let mut fields = vec![
        field("lock", Reply::text(l.lock)),
        field("holder", Reply::text(l.holder)),
        field("epoch", int(l.epoch)),
        field("token", Reply::text(l.token)),
        field("lease_id", Reply::text(l.lease_id)),
        field("ttl_ms", int(l.ttl_ms)),
        field("lock_delay_ms", int(l.lock_delay_ms)),
    ];
    if let Some(value) = l.value {
        fields.push(field("value", Reply::Bulk(value.into())));
    }
    if let Some(session) = l.session {
        fields.push(field("session", Reply::text(session)));
    }
    Reply::Map(fields)
}

fn keepalive_reply(k: KeepaliveInfo) -> Reply {
    Reply::Map(vec![
        field("lease_id", Reply::text(k.lease_id)),
        field("lock", Reply::text(k.lock)),
        field("epoch", int(k.epoch)),
        field("ttl_ms", int(k.ttl_ms)),
    ])
}

fn released_reply(r: Released) -> Reply {
    Reply::Map(vec![
        field("lease_id", Reply::text(r.lease_id)),
        field("lock", Reply::text(r.lock)),
        field("epoch", int(r.epoch)),
        field("released", Reply::Bool(r.released)),
    ])
}

/// `revision` and `epoch` (the HTTP answer's body) and `replayed` (its
/// `Idempotent-Replayed` header).
fn written_reply(a: Applied) -> Reply {
    Reply::Map(vec![
        field("revision", int(a.revision)),
        field("epoch", int(a.epoch)),
        field("replayed", Reply::Bool(a.replayed)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(reply: &Reply) -> Vec<String> {
        match reply {
            Reply::Map(fields) => fields.iter().map(|(k, _)| k.clone()).collect(),
            other => panic!("not a map: {other:?}"),
        }
    }

    fn json_keys(value: impl serde::Serialize) -> Vec<String> {
        let value = serde_json::to_value(value).unwrap();
        let mut keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    /// A field added to an HTTP answer must reach the RESP reply too.
    #[test]
    fn replies_carry_every_field_of_the_http_answer() {
        let lease = Lease {
            lock: "l".into(),
            holder: "h".into(),
            epoch: 1,
            token: "t".into(),
            lease_id: "id".into(),
            ttl_ms: 5,
            lock_delay_ms: 0,
            value: Some(vec![1]),
            session: Some("s".into()),
        };
        assert_eq!(sorted(keys(&lease_reply(lease.clone()))), json_keys(&lease));
        let info = KeepaliveInfo {
            lease_id: "id".into(),
            lock: "l".into(),
            epoch: 1,
            ttl_ms: 5,
        };
        assert_eq!(
            sorted(keys(&keepalive_reply(info.clone()))),
            json_keys(&info)
        );
        let released = Released {
            lease_id: "id".into(),
            lock: "l".into(),
            epoch: 1,
            released: true,
        };
        assert_eq!(
            sorted(keys(&released_reply(released.clone()))),
            json_keys(&released)
        );
        let applied = Applied {
            revision: 1,
            epoch: 1,
            high_water: Default::default(),
            replayed: false,
            advanced: true,
        };
        let mut written = keys(&written_reply(applied));
        written.retain(|k| k != "replayed");
        assert_eq!(
            sorted(written),
            json_keys(wire::WriteAnswer {
                revision: 1,
                epoch: 1
            })
        );
    }

    #[test]
    fn commands_are_found_in_any_case_and_unknown_ones_are_not() {
        assert_eq!(Command::parse(b"lock.acquire"), Some(Command::Acquire));
        assert_eq!(Command::parse(b"KV.Put"), Some(Command::Put));
        assert_eq!(Command::parse(b"SET"), None);
        assert_eq!(Command::parse(b""), None);
    }

    #[test]
    fn an_error_reply_carries_the_code_and_the_details() {
        let e = ApiError::new(
            ErrorDetail::StaleToken {
                high_water: 5,
                epoch: 3,
            },
            "stale",
        );
        assert_eq!(
            error_reply(e),
            Reply::Error {
                code: "STALE_TOKEN".into(),
                message: "stale epoch=3 high_water=5".into()
            }
        );
    }
}
