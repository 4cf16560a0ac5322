//! Browser origin safety: which requests a web page may make.
//!
//! A keyless server on loopback is reachable from any page the user
//! visits, two ways. DNS rebinding: a name the attacker controls
//! (`attacker.example`) is made to resolve to 127.0.0.1, and the page —
//! same-origin with that name as far as the browser knows — reads and
//! writes everything; the request then carries `Host: attacker.example`.
//! Cross-site requests: a page may send a "simple" request (a form, a
//! `text/plain` fetch) to any address without asking first; it cannot read
//! the answer, but the request takes effect; it carries the page's
//! `Origin`. So every request's `Host` must be a name of this server, and
//! every state-changing request (any method but GET, HEAD and OPTIONS) and
//! every upgrade (the WebSocket) must come from no page (no `Origin`: SDKs,
//! curl), this server's own page, or a configured origin. JSON bodies sent
//! as another type are refused where they are read (`extract::Body`).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{HOST, ORIGIN, UPGRADE};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The config key that allows more hosts.
pub const HOSTS_KEY: &str = "allowed_hosts";
/// The config key that allows more origins.
pub const ORIGINS_KEY: &str = "allowed_origins";

/// An entry of `allowed_hosts` or `allowed_origins` that is not one.
#[derive(Debug, thiserror::Error)]
#[error("{key} entry `{entry}` is not valid: {why}")]
pub struct PolicyError {
    pub key: &'static str,
    pub entry: String,
    pub why: &'static str,
}

/// Who may make which request; built from the settings and the address
/// the server listens on.
#[derive(Debug, Clone)]
pub struct Policy {
    listen: IpAddr,
    any_host: bool,
    /// Configured names, lower case, each with the port it must come
    /// with (none: any).
    hosts: Vec<(String, Option<u16>)>,
    any_origin: bool,
    /// Configured origins as browsers write them: `scheme://host[:port]`,
    /// lower case.
    origins: Vec<String>,
}

impl Policy {
    pub fn new(
        listen: SocketAddr,
        allowed_hosts: &[String],
        allowed_origins: &[String],
    ) -> Result<Policy, PolicyError> {
        let mut policy = Policy {
            listen: listen.ip(),
            any_host: false,
            hosts: Vec::new(),
            any_origin: false,
            origins: Vec::new(),
        };
        for entry in allowed_hosts {
            if entry.trim() == "*" {
                policy.any_host = true;
                continue;
            }
            let (name, port) = split_host(entry).ok_or_else(|| PolicyError {
                key: HOSTS_KEY,
                entry: entry.clone(),
                why: "give a host name or address, with an optional port (`toolwire.example.com`, \
                      `box.lan:8283`), or `*`",
            })?;
            policy.hosts.push((name, port));
        }
        for entry in allowed_origins {
            if entry.trim() == "*" {
                policy.any_origin = true;
                continue;
            }
            let origin = normalize_origin(entry).ok_or_else(|| PolicyError {
                key: ORIGINS_KEY,
                entry: entry.clone(),
                why: "give an origin as a browser sends it: `scheme://host[:port]` with no path \
                      (`https://toolwire.example.com`), or `*`",
            })?;
            policy.origins.push(origin);
        }
        Ok(policy)
    }

    /// Whether a request for `authority` (its `Host`) is for this server:
    /// loopback names, the listen address (any address, when listening on
    /// all of them: DNS rebinding needs a name, never an address), or a
    /// configured name.
    fn host_allowed(&self, authority: &str) -> bool {
        if self.any_host {
            return true;
        }
        let Some((name, port)) = split_host(authority) else {
            return false;
        };
        if name == "localhost" {
            return true;
        }
        let literal = name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or(&name);
        if let Ok(ip) = literal.parse::<IpAddr>()
            && (ip.is_loopback() || ip == self.listen || self.listen.is_unspecified())
        {
            return true;
        }
        self.hosts
            .iter()
            .any(|(allowed, p)| *allowed == name && p.is_none_or(|p| Some(p) == port))
    }

    /// Whether a page at `origin` may change things through a request
    /// that came in for `host` (an allowed one): this server's own page,
    /// as reached through that host, or a configured origin.
    fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        let Some(origin) = normalize_origin(origin) else {
            return false;
        };
        if self.any_origin || self.origins.contains(&origin) {
            return true;
        }
        let Some((scheme, authority)) = origin.split_once("://") else {
            return false;
        };
        host.is_some_and(|host| {
            without_default_port(scheme, &host.to_ascii_lowercase())
                == without_default_port(scheme, authority)
        })
    }

    /// The refusal of `headers` and `method`, if any.
    pub fn check(&self, method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
        let host = match headers.get(HOST) {
            // HTTP/1.0 clients may send none; no browser does.
            None => None,
            Some(value) => match value.to_str() {
                Ok(host) if self.host_allowed(host) => Some(host),
                Ok(host) => return Err(host_refused(host)),
                Err(_) => return Err(host_refused("(not ASCII)")),
            },
        };
        let changes = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        if !changes && !headers.contains_key(UPGRADE) {
            return Ok(());
        }
        let Some(origin) = headers.get(ORIGIN) else {
            return Ok(());
        };
        let origin = origin.to_str().unwrap_or("(not ASCII)");
        if self.origin_allowed(origin, host) {
            return Ok(());
        }
        Err(origin_refused(origin, headers.contains_key(UPGRADE)))
    }
}

/// Middleware: refuses what [`Policy::check`] refuses before any route
/// (or key check) sees it.
pub async fn guard(State(policy): State<Arc<Policy>>, request: Request, next: Next) -> Response {
    match policy.check(request.method(), request.headers()) {
        Ok(()) => next.run(request).await,
        // The body is left unread: the connection closes after the
        // answer, which is what a refused page should get.
        Err(refusal) => refusal.into_response(),
    }
}

/// At most this much of a hostile value goes back in a message.
fn clip(value: &str) -> String {
    value.chars().take(100).collect()
}

fn host_refused(host: &str) -> ApiError {
    let host = clip(host);
    let name = split_host(&host).map_or_else(|| host.clone(), |(name, _)| name);
    ApiError::new(
        StatusCode::FORBIDDEN,
        "HOST_NOT_ALLOWED",
        format!(
            "the Host `{host}` is not a name of this server: it answers requests for localhost, \
             127.0.0.1, [::1] and its listen address only, so that a web page cannot reach it \
             through DNS rebinding; to serve it under this name (e.g. behind a reverse proxy), \
             add \"{name}\" to {HOSTS_KEY} in the config"
        ),
    )
    .with("host", host)
    .with("config_key", HOSTS_KEY)
}

fn origin_refused(origin: &str, upgrade: bool) -> ApiError {
    let origin = clip(origin);
    let what = if upgrade {
        "open a WebSocket here"
    } else {
        "change anything here"
    };
    ApiError::new(
        StatusCode::FORBIDDEN,
        "ORIGIN_NOT_ALLOWED",
        format!(
            "a web page at `{origin}` may not {what}: requests that change state and WebSocket \
             upgrades are taken from this server's own page and from clients that send no \
             Origin (SDKs, curl); to allow that page, add \"{origin}\" to {ORIGINS_KEY} in the \
             config"
        ),
    )
    .with("origin", origin)
    .with("config_key", ORIGINS_KEY)
}

/// `name[:port]` of a `Host` value (or an `allowed_hosts` entry): the name
/// in lower case without a trailing dot (`[…]` kept around an IPv6
/// address).
fn split_host(value: &str) -> Option<(String, Option<u16>)> {
    let value = value.trim();
    if value.is_empty() || value.contains('@') {
        return None;
    }
    let authority: Authority = value.parse().ok()?;
    // Read here: `Authority` takes `host:` (an empty port) and a port too
    // large for a u16 as no port; neither is a host to allow.
    let port = match authority.as_str().get(authority.host().len()..) {
        Some("") => None,
        Some(rest) => Some(rest.strip_prefix(':')?.parse::<u16>().ok()?),
        None => return None,
    };
    let name = authority.host().trim_end_matches('.').to_ascii_lowercase();
    (!name.is_empty()).then_some((name, port))
}

/// An origin as browsers send it (`scheme://host[:port]`), lower case; a
/// trailing `/` in a configured one is forgiven. `None` for anything else
/// (`null`, a path, a scheme without a host).
fn normalize_origin(value: &str) -> Option<String> {
    let value = value.trim().to_ascii_lowercase();
    let value = value.strip_suffix('/').unwrap_or(&value);
    let (scheme, authority) = value.split_once("://")?;
    let scheme_ok = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !scheme_ok || authority.contains(['/', '?', '#']) {
        return None;
    }
    split_host(authority)?;
    Some(format!("{scheme}://{authority}"))
}

/// `authority` without the port its scheme implies (browsers leave it out
/// of `Origin`; clients leave it out of `Host`).
fn without_default_port<'a>(scheme: &str, authority: &'a str) -> &'a str {
    let default = match scheme {
        "http" | "ws" => ":80",
        "https" | "wss" => ":443",
        _ => return authority,
    };
    authority.strip_suffix(default).unwrap_or(authority)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn policy(hosts: &[&str], origins: &[&str]) -> Policy {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Policy::new(
            "127.0.0.1:8283".parse().unwrap(),
            &owned(hosts),
            &owned(origins),
        )
        .unwrap()
    }

    #[test]
    fn loopback_names_and_the_listen_address_are_hosts_by_default() {
        let p = policy(&[], &[]);
        for host in [
            "localhost",
            "localhost:8283",
            "LOCALHOST:1",
            "localhost.:8283",
            "127.0.0.1:8283",
            "127.0.0.1",
            "127.9.9.9:80",
            "[::1]:8283",
            "[::1]",
        ] {
            assert!(p.host_allowed(host), "{host}");
        }
        for host in [
            "attacker.example",
            "attacker.example:8283",
            "localhost.attacker.example:8283",
            "127.0.0.1.nip.io:8283",
            "0.0.0.0:8283",
            "192.168.1.2:8283",
            "user@localhost:8283",
            "localhost:",
            "localhost:99999",
            "",
        ] {
            assert!(!p.host_allowed(host), "{host}");
        }
    }

    #[test]
    fn configured_hosts_match_by_name_and_port_when_given() {
        let p = policy(&["Toolwire.Example.com", "box.lan:8283"], &[]);
        assert!(p.host_allowed("toolwire.example.com"));
        assert!(p.host_allowed("toolwire.example.com:443"));
        assert!(p.host_allowed("box.lan:8283"));
        assert!(!p.host_allowed("box.lan:8284"));
        assert!(!p.host_allowed("box.lan"));
        assert!(policy(&["*"], &[]).host_allowed("anything.example:1"));
        assert!(Policy::new("127.0.0.1:1".parse().unwrap(), &["a/b".into()], &[]).is_err());
    }

    #[test]
    fn listening_on_every_address_allows_addresses_not_names() {
        let owned: Vec<String> = Vec::new();
        let p = Policy::new("0.0.0.0:8283".parse().unwrap(), &owned, &owned).unwrap();
        assert!(p.host_allowed("192.168.1.2:8283"));
        assert!(!p.host_allowed("attacker.example:8283"));
    }

    #[test]
    fn the_own_origin_is_the_host_the_request_came_through() {
        let p = policy(&["toolwire.example.com"], &["https://ui.example.com/"]);
        assert!(p.origin_allowed("http://127.0.0.1:8283", Some("127.0.0.1:8283")));
        assert!(p.origin_allowed("http://LOCALHOST:8283", Some("localhost:8283")));
        assert!(p.origin_allowed("https://toolwire.example.com", Some("toolwire.example.com")));
        assert!(p.origin_allowed("http://localhost", Some("localhost:80")));
        assert!(p.origin_allowed("https://ui.example.com", Some("127.0.0.1:8283")));
        assert!(!p.origin_allowed("http://localhost:3000", Some("localhost:8283")));
        assert!(!p.origin_allowed("http://attacker.example", Some("127.0.0.1:8283")));
        assert!(!p.origin_allowed("null", Some("127.0.0.1:8283")));
        assert!(!p.origin_allowed("http://127.0.0.1:8283", None));
        assert!(
            Policy::new(
                "127.0.0.1:1".parse().unwrap(),
                &[],
                &["https://x.example/path".into()]
            )
            .is_err()
        );
    }
}
