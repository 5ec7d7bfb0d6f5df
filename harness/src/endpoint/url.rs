//! The endpoint's address: `http://HOST[:PORT][/PREFIX]`. Plain HTTP only: the client speaks
//! HTTP/1.1 over a TCP stream and carries no TLS stack, so `https://` is refused by name rather
//! than sent in clear text to a TLS port.

/// A parsed base URL; request paths (`/v1/completions`, `/metrics`) go after `prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    /// What was given, for messages and `summary.json`.
    pub text: String,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash (`""` or `/api`).
    pub prefix: String,
}

impl BaseUrl {
    pub fn parse(text: &str) -> Result<BaseUrl, String> {
        let t = text.trim();
        let rest = if let Some(r) = t.strip_prefix("http://") {
            r
        } else if t.starts_with("https://") {
            return Err(format!(
                "--endpoint {t}: https is not supported (the client speaks plain HTTP/1.1); \
                 use http:// or a TLS-terminating proxy on this machine"
            ));
        } else {
            return Err(format!(
                "--endpoint {t}: expected http://HOST[:PORT][/PREFIX]"
            ));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err(format!(
                "--endpoint {t}: expected http://HOST[:PORT][/PREFIX] (no user info)"
            ));
        }
        let (host, port) = if let Some(h) = authority.strip_prefix('[') {
            // [IPv6]:port
            let end = h
                .find(']')
                .ok_or_else(|| format!("--endpoint {t}: unclosed '[' in the host"))?;
            let port = match &h[end + 1..] {
                "" => 80,
                p => parse_port(p.strip_prefix(':').unwrap_or("x"), t)?,
            };
            (h[..end].to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), parse_port(p, t)?),
                None => (authority.to_string(), 80),
            }
        };
        if host.is_empty() {
            return Err(format!("--endpoint {t}: no host"));
        }
        let mut prefix = path.trim_end_matches('/').to_string();
        // A base given as .../v1 (as OpenAI clients take it) names the same server.
        if prefix.ends_with("/v1") {
            prefix.truncate(prefix.len() - 3);
        }
        if prefix.contains(['?', '#', ' ']) {
            return Err(format!(
                "--endpoint {t}: a query or fragment cannot be part of the base URL"
            ));
        }
        Ok(BaseUrl {
            text: t.to_string(),
            host,
            port,
            prefix,
        })
    }

    /// `host:port` for connecting (IPv6 in brackets).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The request target for `path` (which starts with `/`).
    pub fn path(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }
}

fn parse_port(p: &str, t: &str) -> Result<u16, String> {
    p.parse::<u16>()
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| format!("--endpoint {t}: port {p:?} is not a port number (1-65535)"))
}

#[cfg(test)]
mod tests {
    use super::BaseUrl;

    #[test]
    fn parses_hosts_ports_and_prefixes() {
        let u = BaseUrl::parse("http://127.0.0.1:8000").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.prefix.as_str()),
            ("127.0.0.1", 8000, "")
        );
        assert_eq!(u.path("/v1/models"), "/v1/models");
        let u = BaseUrl::parse("http://example/api/v1/").unwrap();
        assert_eq!((u.port, u.prefix.as_str()), (80, "/api"));
        let u = BaseUrl::parse("http://[::1]:9000").unwrap();
        assert_eq!(u.authority(), "[::1]:9000");
    }

    #[test]
    fn refuses_https_and_garbage() {
        assert!(BaseUrl::parse("https://x:1")
            .unwrap_err()
            .contains("https is not supported"));
        assert!(BaseUrl::parse("ftp://x").is_err());
        assert!(BaseUrl::parse("http://x:0").is_err());
        assert!(BaseUrl::parse("http://x:99999").is_err());
        assert!(BaseUrl::parse("http://:80").is_err());
    }
}
