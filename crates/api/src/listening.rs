//! The start-up line: `palisade serve` prints `palisade listening on <URL>` on stdout once
//! its sockets accept connections, and nothing else on stdout before it. With a RESP
//! listener the line names its URL too, after a comma: `palisade listening on
//! http://127.0.0.1:7700, redis://127.0.0.1:7701`. Scripts and tests read it to learn the
//! addresses (useful with port 0). A second line names the dashboard for people:
//! `palisade dashboard on http://127.0.0.1:7700/ui`.

/// What the line starts with.
pub const PREFIX: &str = "palisade listening on ";

/// The line for a server reachable at `url` (`http://127.0.0.1:7700`) and, when it has
/// one, at the RESP URL `resp` (`redis://127.0.0.1:7701`).
pub fn line(url: &str, resp: Option<&str>) -> String {
    match resp {
        Some(resp) => format!("{PREFIX}{url}, {resp}"),
        None => format!("{PREFIX}{url}"),
    }
}

/// The line after it, for people: where the dashboard is.
pub fn dashboard_line(url: &str) -> String {
    format!("palisade dashboard on {}/ui", url.trim_end_matches('/'))
}

/// The HTTP URL in a start-up line, if `line` is one (surrounding whitespace ignored).
pub fn parse(line: &str) -> Option<&str> {
    urls(line).next()
}

/// The RESP URL in a start-up line, if the server has a RESP listener.
pub fn parse_resp(line: &str) -> Option<&str> {
    urls(line).find(|u| u.starts_with("redis://") || u.starts_with("rediss://"))
}

fn urls(line: &str) -> impl Iterator<Item = &str> {
    line.trim()
        .strip_prefix(PREFIX)
        .into_iter()
        .flat_map(|rest| rest.split(", "))
        .filter(|url| !url.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_parse_agree() {
        let l = line("https://127.0.0.1:7700", None);
        assert_eq!(parse(&format!("{l}\n")), Some("https://127.0.0.1:7700"));
        assert_eq!(parse_resp(&l), None);
        let l = line("http://127.0.0.1:7700", Some("redis://127.0.0.1:7701"));
        assert_eq!(parse(&l), Some("http://127.0.0.1:7700"));
        assert_eq!(parse_resp(&l), Some("redis://127.0.0.1:7701"));
        assert_eq!(parse("palisade listening on "), None);
        assert_eq!(parse("error: cannot listen"), None);
        let d = dashboard_line("http://127.0.0.1:7700");
        assert_eq!(d, "palisade dashboard on http://127.0.0.1:7700/ui");
        assert_eq!(parse(&d), None, "not taken for the start-up line");
    }
}
