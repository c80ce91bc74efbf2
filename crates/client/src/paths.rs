//! Building request URLs from a base URL and user-supplied names.
//!
//! Lock names, lease ids and keys come from callers, so each path segment is
//! percent-encoded: every byte outside RFC 3986's unreserved set (`A-Z a-z 0-9 - . _ ~`)
//! becomes `%XX`. A key keeps `/` as its segment separator, so `a/b c` is sent as
//! `a/b%20c` and the server sees the key it was given.
//!
//! URL parsers remove the dot segments `.` and `..` (and their encoded forms) before the
//! request leaves, which would silently address a different key or endpoint. Such
//! segments are refused here with [`Error::BadRequest`] instead of being sent.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::Error;

/// Every byte outside RFC 3986's unreserved set is encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Appends the percent-encoded form of one path segment to `out`.
fn encode_segment_into(segment: &str, out: &mut String) {
    out.extend(utf8_percent_encode(segment, SEGMENT));
}

fn is_dot_segment(segment: &str) -> bool {
    segment == "." || segment == ".."
}

/// Encodes a name that must be exactly one path segment (a lock name or a lease id).
pub(crate) fn segment(what: &str, value: &str) -> Result<String, Error> {
    if value.is_empty() {
        return Err(Error::BadRequest(format!("{what} must not be empty")));
    }
    if is_dot_segment(value) {
        return Err(Error::BadRequest(format!(
            "{what} {value:?} cannot be sent in a URL path"
        )));
    }
    let mut out = String::with_capacity(value.len());
    encode_segment_into(value, &mut out);
    Ok(out)
}

/// Encodes a key: each `/`-separated segment on its own, separators kept.
pub(crate) fn key_path(key: &str) -> Result<String, Error> {
    if key.is_empty() {
        return Err(Error::BadRequest("key must not be empty".into()));
    }
    let mut out = String::with_capacity(key.len());
    for (i, part) in key.split('/').enumerate() {
        if is_dot_segment(part) {
            return Err(Error::BadRequest(format!(
                "key {key:?} has a {part:?} segment, which URL normalisation would remove"
            )));
        }
        if i > 0 {
            out.push('/');
        }
        encode_segment_into(part, &mut out);
    }
    Ok(out)
}

/// Normalises a base URL: parses it, requires http(s), and drops a trailing `/` so that
/// paths can be appended as `{base}/v1/...`.
pub(crate) fn normalise_base(base_url: &str) -> Result<String, Error> {
    // `127.0.0.1:7700` does not parse, and `localhost:7700` parses with the scheme
    // `localhost`: both lack the scheme.
    let no_scheme = || {
        Error::BadRequest(format!(
            "base URL {base_url:?} has no http:// or https://: write http://{base_url} (or \
             https:// when the server has TLS)"
        ))
    };
    let parsed = reqwest::Url::parse(base_url).map_err(|e| {
        if base_url.contains("://") {
            Error::BadRequest(format!("invalid base URL {base_url:?}: {e}"))
        } else {
            no_scheme()
        }
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        if !base_url.contains("://") {
            return Err(no_scheme());
        }
        return Err(Error::BadRequest(format!(
            "base URL {base_url:?} is not http(s)"
        )));
    }
    // The routes are under /v1 already; a base ending in it doubles it, and every
    // request then misses.
    if parsed.path().trim_end_matches('/').ends_with("/v1") {
        return Err(Error::BadRequest(format!(
            "base URL {base_url:?} ends in /v1: give the server's own URL (like \
             http://127.0.0.1:7700), the client adds /v1 to each request"
        )));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(Error::BadRequest(format!(
            "base URL {base_url:?} must not have a query or fragment"
        )));
    }
    Ok(parsed.as_str().trim_end_matches('/').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_that_cannot_be_meant_are_refused_with_the_fix() {
        for (url, says) in [
            ("127.0.0.1:7700", "write http://127.0.0.1:7700"),
            ("localhost:7700", "write http://localhost:7700"),
            ("http://localhost:7700/v1", "ends in /v1"),
            ("http://localhost:7700/v1/", "ends in /v1"),
            ("ftp://localhost:7700", "is not http(s)"),
        ] {
            let err = normalise_base(url).unwrap_err().to_string();
            assert!(err.contains(says), "{url}: {err}");
        }
        assert_eq!(
            normalise_base("https://proxy.example/palisade/").unwrap(),
            "https://proxy.example/palisade"
        );
    }

    #[test]
    fn unreserved_characters_pass_through() {
        assert_eq!(segment("lock", "Az09-._~").unwrap(), "Az09-._~");
    }

    #[test]
    fn everything_else_is_percent_encoded() {
        assert_eq!(
            segment("lock", "a b/c?d#e%f").unwrap(),
            "a%20b%2Fc%3Fd%23e%25f"
        );
        // Multi-byte UTF-8 is encoded byte by byte.
        assert_eq!(segment("lock", "é").unwrap(), "%C3%A9");
        assert_eq!(segment("lock", "+&=:@").unwrap(), "%2B%26%3D%3A%40");
    }

    #[test]
    fn keys_keep_slash_as_separator() {
        assert_eq!(key_path("a/b c/d").unwrap(), "a/b%20c/d");
        assert_eq!(key_path("users/ü?x").unwrap(), "users/%C3%BC%3Fx");
        // Empty segments are part of the key and are kept.
        assert_eq!(key_path("a//b/").unwrap(), "a//b/");
        assert_eq!(key_path("/lead").unwrap(), "/lead");
    }

    #[test]
    fn dot_segments_are_refused_not_normalised() {
        for key in [".", "..", "a/../b", "a/./b", "a/.."] {
            assert!(matches!(key_path(key), Err(Error::BadRequest(_))), "{key}");
        }
        // Dots inside a segment are ordinary characters.
        assert_eq!(key_path("a/.hidden/b..c").unwrap(), "a/.hidden/b..c");
        assert!(segment("lock", "..").is_err());
        assert!(segment("lock", "").is_err());
        assert!(key_path("").is_err());
    }

    #[test]
    fn base_url_is_normalised() {
        assert_eq!(
            normalise_base("http://127.0.0.1:7700").unwrap(),
            "http://127.0.0.1:7700"
        );
        assert_eq!(
            normalise_base("http://127.0.0.1:7700/").unwrap(),
            "http://127.0.0.1:7700"
        );
        assert_eq!(
            normalise_base("https://h/prefix/").unwrap(),
            "https://h/prefix"
        );
        assert!(normalise_base("127.0.0.1:7700").is_err());
        assert!(normalise_base("ftp://h").is_err());
        assert!(normalise_base("http://h/?x=1").is_err());
    }

    #[test]
    fn encoded_paths_survive_url_parsing_unchanged() {
        let base = normalise_base("http://h:1").unwrap();
        let key = "dir/a b/..x/%2e/ü";
        let url = format!(
            "{base}/v1/kv/{}/{}",
            segment("lock", "l").unwrap(),
            key_path(key).unwrap()
        );
        let parsed = reqwest::Url::parse(&url).unwrap();
        assert_eq!(parsed.path(), "/v1/kv/l/dir/a%20b/..x/%252e/%C3%BC");
    }
}
