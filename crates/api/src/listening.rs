//! The start-up line: `palisade serve` prints `palisade listening on <URL>` on stdout once
//! its socket accepts connections, and nothing else on stdout before it. Scripts and tests
//! read it to learn the address (useful with port 0).

/// What the line starts with.
pub const PREFIX: &str = "palisade listening on ";

/// The line for a server reachable at `url` (`http://127.0.0.1:7700`).
pub fn line(url: &str) -> String {
    format!("{PREFIX}{url}")
}

/// The URL in a start-up line, if `line` is one (surrounding whitespace ignored).
pub fn parse(line: &str) -> Option<&str> {
    line.trim()
        .strip_prefix(PREFIX)
        .filter(|url| !url.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_parse_agree() {
        let l = line("https://127.0.0.1:7700");
        assert_eq!(parse(&format!("{l}\n")), Some("https://127.0.0.1:7700"));
        assert_eq!(parse("palisade listening on "), None);
        assert_eq!(parse("error: cannot listen"), None);
    }
}
