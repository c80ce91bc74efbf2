//! RESP on the wire: commands in, replies out. Pure functions over byte buffers; the
//! connection loop (`transport/resp.rs`) owns the buffers and the socket.
//!
//! ## Why by hand
//! A command is one flat array of bulk strings (`*<n>\r\n` then `n` times
//! `$<len>\r\n<bytes>\r\n`), which is all a client library sends. The decoders of the RESP
//! crates parse every RESP type and recurse into nested arrays without a depth limit, so a
//! client could make the server recurse once per four bytes it sends; and they have no
//! bound on the lengths a frame announces. This parser accepts only what a command is,
//! checks every announced length against [`Bounds`] before it waits for the bytes, and
//! never recurses. The reply side is the handful of types the commands answer with.

use bytes::{Bytes, BytesMut};

/// What one command may hold.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// Most arguments, the command's name included.
    pub(crate) max_args: usize,
    /// Most bytes of all arguments together.
    pub(crate) max_bytes: usize,
}

/// Longest `*<n>` or `$<len>` line, CRLF included: a sign, 19 digits and the CRLF fit.
const MAX_LINE: usize = 24;

/// Most arguments any command may have, whatever [`Bounds::max_args`] says.
const MAX_ARGS: usize = super::MAX_ARGS;

/// Why the bytes a client sent are not a command. The connection answers with it and
/// closes: after a framing error nothing that follows can be trusted to start a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProtocolError {
    #[error("expected '*' (a command is an array of bulk strings), got {0:?}")]
    NotAnArray(char),
    #[error("expected '$' (each argument is a bulk string), got {0:?}")]
    NotABulkString(char),
    #[error("invalid {0} length")]
    BadLength(&'static str),
    #[error("a command has 1 to {0} arguments")]
    TooManyArgs(usize),
    #[error("a command is at most {0} bytes")]
    TooLarge(usize),
    #[error("an argument does not end with CRLF")]
    MissingCrlf,
}

/// Takes the first complete command off `buf`: `Ok(None)` while it is incomplete (nothing
/// is consumed then). Every length is checked as soon as it is read, so an incomplete
/// command never needs more than `bounds` to complete.
pub(crate) fn next_command(
    buf: &mut BytesMut,
    bounds: Bounds,
) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    if first != b'*' {
        return Err(ProtocolError::NotAnArray(char::from(first)));
    }
    let Some((count, mut at)) = length_line(buf, 0, "array")? else {
        return Ok(None);
    };
    let max_args = bounds.max_args.min(MAX_ARGS);
    if count == 0 || count > max_args {
        return Err(ProtocolError::TooManyArgs(max_args));
    }
    // Where each argument lies, kept on the stack until the whole command is there.
    let mut spans = [(0usize, 0usize); MAX_ARGS];
    let mut total = 0usize;
    for span in &mut spans[..count] {
        let Some(&kind) = buf.get(at) else {
            return Ok(None);
        };
        if kind != b'$' {
            return Err(ProtocolError::NotABulkString(char::from(kind)));
        }
        let Some((len, start)) = length_line(buf, at, "bulk string")? else {
            return Ok(None);
        };
        total = total.saturating_add(len);
        if total > bounds.max_bytes {
            return Err(ProtocolError::TooLarge(bounds.max_bytes));
        }
        let end = start + len;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(ProtocolError::MissingCrlf);
        }
        *span = (start, end);
        at = end + 2;
    }
    let frame = buf.split_to(at).freeze();
    Ok(Some(
        spans[..count]
            .iter()
            .map(|&(s, e)| frame.slice(s..e))
            .collect(),
    ))
}

/// Reads the length line at `at` (`*<n>\r\n` or `$<len>\r\n`): the length and where the
/// line ends, `None` if the line is not complete yet.
fn length_line(
    buf: &[u8],
    at: usize,
    what: &'static str,
) -> Result<Option<(usize, usize)>, ProtocolError> {
    let rest = &buf[at + 1..];
    let window = &rest[..rest.len().min(MAX_LINE)];
    // Digits, then CRLF: anything else is refused as soon as it arrives.
    let Some(cr) = window.iter().position(|b| !b.is_ascii_digit()) else {
        return if rest.len() >= MAX_LINE {
            Err(ProtocolError::BadLength(what))
        } else {
            Ok(None)
        };
    };
    if window[cr] != b'\r' || cr == 0 {
        return Err(ProtocolError::BadLength(what));
    }
    match rest.get(cr + 1) {
        None => return Ok(None),
        Some(b'\n') => {}
        Some(_) => return Err(ProtocolError::BadLength(what)),
    }
    // At most 22 digits fit the window; a value beyond `usize` is refused, not wrapped.
    let n = window[..cr]
        .iter()
        .try_fold(0usize, |n, d| {
            n.checked_mul(10)?.checked_add(usize::from(d - b'0'))
        })
        .ok_or(ProtocolError::BadLength(what))?;
    Ok(Some((n, at + 1 + cr + 2)))
}

/// What a reply may hold. A map keeps the order it was built in.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reply {
    /// `+<text>`: `OK`, `PONG`.
    Status(&'static str),
    Bulk(Bytes),
    Int(i64),
    Bool(bool),
    Null,
    Array(Vec<Reply>),
    Map(Vec<(String, Reply)>),
    /// `-<CODE> <message>`: the stable error code in capitals, as Redis's own codes are.
    Error {
        code: String,
        message: String,
    },
}

impl Reply {
    pub(crate) fn text(s: impl Into<String>) -> Reply {
        Reply::Bulk(Bytes::from(s.into()))
    }

    /// Appends the reply to `out` in RESP3 (`resp3`) or RESP2.
    pub(crate) fn encode(&self, resp3: bool, out: &mut BytesMut) {
        match self {
            Reply::Status(s) => line(out, b'+', s.as_bytes()),
            Reply::Bulk(b) => {
                header(out, b'$', b.len());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Int(i) => number(out, b':', *i),
            Reply::Bool(b) if resp3 => line(out, b'#', if *b { b"t" } else { b"f" }),
            Reply::Bool(b) => line(out, b':', if *b { b"1" } else { b"0" }),
            Reply::Null if resp3 => out.extend_from_slice(b"_\r\n"),
            Reply::Null => out.extend_from_slice(b"$-1\r\n"),
            Reply::Array(items) => {
                header(out, b'*', items.len());
                for item in items {
                    item.encode(resp3, out);
                }
            }
            Reply::Map(fields) => {
                if resp3 {
                    header(out, b'%', fields.len());
                } else {
                    header(out, b'*', fields.len() * 2);
                }
                for (k, v) in fields {
                    header(out, b'$', k.len());
                    out.extend_from_slice(k.as_bytes());
                    out.extend_from_slice(b"\r\n");
                    v.encode(resp3, out);
                }
            }
            Reply::Error { code, message } => {
                out.extend_from_slice(b"-");
                out.extend_from_slice(code.as_bytes());
                out.extend_from_slice(b" ");
                // A simple string cannot hold a line break.
                for b in message.bytes() {
                    out.extend_from_slice(&[if b == b'\r' || b == b'\n' { b' ' } else { b }]);
                }
                out.extend_from_slice(b"\r\n");
            }
        }
    }
}

fn header(out: &mut BytesMut, kind: u8, n: usize) {
    number(out, kind, n);
}

/// `<kind><decimal>\r\n`, written in place.
fn number(out: &mut BytesMut, kind: u8, n: impl std::fmt::Display) {
    use std::fmt::Write;
    out.extend_from_slice(&[kind]);
    // Writing into a BytesMut cannot fail.
    let _ = write!(out, "{n}");
    out.extend_from_slice(b"\r\n");
}

fn line(out: &mut BytesMut, kind: u8, text: &[u8]) {
    out.extend_from_slice(&[kind]);
    out.extend_from_slice(text);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        max_args: 4,
        max_bytes: 16,
    };

    fn parse(bytes: &[u8]) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        next_command(&mut BytesMut::from(bytes), BOUNDS)
    }

    #[test]
    fn a_command_is_taken_whole_and_leaves_the_next_one() {
        let mut buf = BytesMut::from(&b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n*1\r\n$4\r\nPI"[..]);
        let cmd = next_command(&mut buf, BOUNDS).unwrap().unwrap();
        assert_eq!(cmd, vec![Bytes::from("PING"), Bytes::from("hi")]);
        assert_eq!(&buf[..], b"*1\r\n$4\r\nPI");
        assert_eq!(next_command(&mut buf, BOUNDS).unwrap(), None);
        assert_eq!(
            &buf[..],
            b"*1\r\n$4\r\nPI",
            "an incomplete command is not consumed"
        );
        buf.extend_from_slice(b"NG\r\n");
        assert_eq!(
            next_command(&mut buf, BOUNDS).unwrap().unwrap(),
            vec![Bytes::from("PING")]
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn every_prefix_of_a_command_is_incomplete_not_an_error() {
        let whole = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n";
        for n in 0..whole.len() {
            assert_eq!(parse(&whole[..n]), Ok(None), "prefix of {n} bytes");
        }
        assert_eq!(parse(whole).unwrap().unwrap().len(), 3);
    }

    #[test]
    fn what_is_not_a_command_is_refused_before_its_bytes_arrive() {
        assert_eq!(parse(b"PING\r\n"), Err(ProtocolError::NotAnArray('P')));
        assert_eq!(
            parse(b"*1\r\n:1\r\n"),
            Err(ProtocolError::NotABulkString(':'))
        );
        assert_eq!(
            parse(b"*1\r\n*1\r\n"),
            Err(ProtocolError::NotABulkString('*'))
        );
        assert_eq!(parse(b"*0\r\n"), Err(ProtocolError::TooManyArgs(4)));
        assert_eq!(parse(b"*5\r\n"), Err(ProtocolError::TooManyArgs(4)));
        assert_eq!(parse(b"*-1\r\n"), Err(ProtocolError::BadLength("array")));
        assert_eq!(parse(b"*1\r\n$17\r\n"), Err(ProtocolError::TooLarge(16)));
        assert_eq!(
            parse(b"*2\r\n$9\r\nxxxxxxxxx\r\n$8\r\n"),
            Err(ProtocolError::TooLarge(16))
        );
        assert_eq!(
            parse(b"*1\r\n$99999999999999999999999\r\n"),
            Err(ProtocolError::BadLength("bulk string"))
        );
        assert_eq!(
            parse(b"*1\r\n$1\r\nxy\r\n"),
            Err(ProtocolError::MissingCrlf)
        );
        assert_eq!(parse(b"*1\n"), Err(ProtocolError::BadLength("array")));
        // A length line that never ends is refused once it is longer than any length.
        assert_eq!(
            parse(&[b"*".as_slice(), &[b'1'; 30]].concat()),
            Err(ProtocolError::BadLength("array"))
        );
    }

    fn encoded(reply: &Reply, resp3: bool) -> String {
        let mut out = BytesMut::new();
        reply.encode(resp3, &mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn replies_in_both_protocols() {
        let answer = Reply::Map(vec![
            ("lock".into(), Reply::text("a")),
            ("epoch".into(), Reply::Int(7)),
            ("ok".into(), Reply::Bool(true)),
            ("v".into(), Reply::Null),
        ]);
        assert_eq!(
            encoded(&answer, true),
            "%4\r\n$4\r\nlock\r\n$1\r\na\r\n$5\r\nepoch\r\n:7\r\n$2\r\nok\r\n#t\r\n$1\r\nv\r\n_\r\n"
        );
        assert_eq!(
            encoded(&answer, false),
            "*8\r\n$4\r\nlock\r\n$1\r\na\r\n$5\r\nepoch\r\n:7\r\n$2\r\nok\r\n:1\r\n$1\r\nv\r\n$-1\r\n"
        );
        let error = Reply::Error {
            code: "STALE_TOKEN".into(),
            message: "two\r\nlines".into(),
        };
        assert_eq!(encoded(&error, true), "-STALE_TOKEN two  lines\r\n");
        assert_eq!(encoded(&Reply::Status("OK"), false), "+OK\r\n");
        assert_eq!(encoded(&Reply::Bulk(Bytes::from("")), true), "$0\r\n\r\n");
    }
}
