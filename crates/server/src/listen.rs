//! `--listen`: an address or a host name, with a port.
//!
//! `127.0.0.1:7700`, `[::1]:7700` and `localhost:7700` are all accepted. A host name is
//! resolved once, at start; the server binds the first address it resolves to. Every
//! address it resolves to counts when deciding whether the server listens only on
//! loopback (the check that lets it run without `--auth-file`): a name that resolves to
//! one loopback and one public address is not a loopback name.

use std::net::{SocketAddr, ToSocketAddrs};

/// `--listen` resolved: where to bind, and every address the name stood for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddrs {
    /// The address bound: the first one resolved.
    pub bind: SocketAddr,
    /// Every address resolved, `bind` first.
    pub all: Vec<SocketAddr>,
}

impl ListenAddrs {
    /// True when every resolved address is a loopback address.
    pub fn all_loopback(&self) -> bool {
        self.all.iter().all(|a| a.ip().is_loopback())
    }
}

/// Resolves `HOST:PORT` (an IP address, `[v6]:port` or a host name). Blocking: it may
/// ask the system resolver.
pub fn resolve(text: &str) -> Result<ListenAddrs, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(ListenAddrs {
            bind: addr,
            all: vec![addr],
        });
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!(
            "--listen {text:?} has no port: give HOST:PORT, e.g. 127.0.0.1:7700 or localhost:7700"
        ));
    };
    if host.is_empty() {
        return Err(format!(
            "--listen {text:?} has no host: give HOST:PORT, e.g. 127.0.0.1:7700"
        ));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("--listen {text:?}: {port:?} is not a port (0 to 65535)"))?;
    let mut all: Vec<SocketAddr> = Vec::new();
    for addr in (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("--listen {text:?}: cannot resolve {host:?}: {e}"))?
    {
        if !all.contains(&addr) {
            all.push(addr);
        }
    }
    let bind = *all
        .first()
        .ok_or_else(|| format!("--listen {text:?}: {host:?} resolves to no address"))?;
    Ok(ListenAddrs { bind, all })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_without_resolving() {
        let v4 = resolve("127.0.0.1:7700").unwrap();
        assert_eq!(v4.bind, "127.0.0.1:7700".parse().unwrap());
        assert!(v4.all_loopback());
        let v6 = resolve("[::1]:0").unwrap();
        assert!(v6.all_loopback());
        assert!(!resolve("0.0.0.0:7700").unwrap().all_loopback());
    }

    #[test]
    fn localhost_resolves_to_loopback_only() {
        let addrs = resolve("localhost:7700").unwrap();
        assert!(!addrs.all.is_empty());
        assert!(addrs.all_loopback(), "{addrs:?}");
        assert_eq!(addrs.bind.port(), 7700);
        assert_eq!(addrs.bind, addrs.all[0]);
    }

    #[test]
    fn bad_input_says_what_is_wrong() {
        assert!(resolve("localhost").unwrap_err().contains("no port"));
        assert!(resolve(":7700").unwrap_err().contains("no host"));
        assert!(resolve("localhost:http")
            .unwrap_err()
            .contains("not a port"));
        assert!(resolve("localhost:70000")
            .unwrap_err()
            .contains("not a port"));
        assert!(resolve("no-such-host.invalid:7700")
            .unwrap_err()
            .contains("cannot resolve"));
    }

    #[test]
    fn a_mixed_name_is_not_loopback() {
        let addrs = ListenAddrs {
            bind: "127.0.0.1:1".parse().unwrap(),
            all: vec![
                "127.0.0.1:1".parse().unwrap(),
                "192.0.2.1:1".parse().unwrap(),
            ],
        };
        assert!(!addrs.all_loopback());
    }
}
