//! The config of one MCP server ([`McpServerConfig`]), its validation, and
//! how it and its URL are shown without secrets ([`redact_url`]).

use std::collections::{BTreeMap, HashMap};

use reqwest::header::{HeaderName, HeaderValue};
use serde::Deserialize;
use toolwire_sandbox::Mode;

use super::McpError;

/// Headers rmcp sets itself on every request (and rejects as custom
/// headers, failing each request): refused at validation instead.
const RESERVED_HEADERS: [&str; 3] = ["Accept", "Mcp-Session-Id", "Last-Event-Id"];

/// One MCP server from the config: `[mcp_servers.NAME]` with either
/// `command`, `args`, `env`, `env_vars`, `sandbox` and `network` for a
/// stdio server, or `url` and `headers` for a streamable HTTP server. A
/// stdio server inherits only the sandbox's allow-listed environment
/// (never toolwire's own or the providers' keys), the names in `env_vars`,
/// and `env`. See
/// [`McpServerConfig::validate`] for what is rejected. `Debug` shows the
/// names of `headers` and `env` but not their values, and the URL without
/// credentials or query (all often secrets).
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Prefix of the server's tool names; in TOML it is the table's key.
    #[serde(default)]
    pub name: String,
    /// The program of a stdio server.
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// Set in the server's environment (values may be secrets).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names passed through from toolwire's environment besides the
    /// allow-list (toolwire's own and the providers' keys never are).
    #[serde(default)]
    pub env_vars: Vec<String>,
    /// Start the server through the command sandbox in this mode, working
    /// in the workspace; unset: unconfined, in toolwire's directory.
    #[serde(default)]
    pub sandbox: Option<Mode>,
    /// Whether a sandboxed server may use the network [default: false].
    #[serde(default)]
    pub network: Option<bool>,
    /// The endpoint of a streamable HTTP server (`http://` or `https://`).
    #[serde(default)]
    pub url: Option<String>,
    /// Sent with every request to `url`, e.g. `Authorization`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Seconds one tool call may take [default: 120].
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

impl std::fmt::Debug for McpServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServerConfig")
            .field("name", &self.name)
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &Redacted(&self.env))
            .field("env_vars", &self.env_vars)
            .field("sandbox", &self.sandbox)
            .field("network", &self.network)
            .field("url", &self.url.as_deref().map(redact_url))
            .field("headers", &Redacted(&self.headers))
            .field("timeout_secs", &self.timeout_secs)
            .finish()
    }
}

/// A map shown with its keys only.
struct Redacted<'a>(&'a BTreeMap<String, String>);

impl std::fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|key| (key, "<redacted>")))
            .finish()
    }
}

/// `url` as it may be shown: scheme, host, port and path, without user
/// name, password, query or fragment, which often carry credentials
/// (`?key=…`). Errors and warnings that name an HTTP server end up in
/// logs, tool results (so the model and the database) and editors.
pub fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) => {
            // Both fail only for URLs that cannot have credentials at all.
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.set_query(None);
            parsed.set_fragment(None);
            parsed.to_string()
        }
        Err(_) => "(not a URL)".to_owned(),
    }
}

/// How a configured server is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint<'a> {
    Stdio { command: &'a str },
    Http { url: &'a str },
}

impl McpServerConfig {
    /// A stdio server running `command` (no arguments yet).
    pub fn stdio(name: impl Into<String>, command: impl Into<String>) -> Self {
        McpServerConfig {
            name: name.into(),
            command: Some(command.into()),
            ..Default::default()
        }
    }

    /// A streamable HTTP server at `url` (no headers yet).
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        McpServerConfig {
            name: name.into(),
            url: Some(url.into()),
            ..Default::default()
        }
    }

    /// Checks that the config names exactly one way to reach the server
    /// (`command` or `url`), that the fields of the other way are not set
    /// (they would be silently ignored), and that the URL and headers can
    /// be sent. The error names the server.
    pub fn validate(&self) -> Result<(), McpError> {
        self.endpoint().map(|_| ())
    }

    pub(super) fn endpoint(&self) -> Result<Endpoint<'_>, McpError> {
        let problem = |problem: String| McpError::Config {
            server: self.name.clone(),
            problem,
        };
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => Err(problem(
                "give either `command` (a stdio server) or `url` (a streamable HTTP \
                 server), not both"
                    .into(),
            )),
            (None, None) => Err(problem(
                "give `command` (a stdio server) or `url` (a streamable HTTP server)".into(),
            )),
            (Some(command), None) => {
                if self.network.is_some() && self.sandbox.is_none() {
                    return Err(problem(
                        "`network` applies to a sandboxed server: set `sandbox` too".into(),
                    ));
                }
                if !self.headers.is_empty() {
                    return Err(problem(
                        "`headers` are for `url` servers; a `command` server gets `env`".into(),
                    ));
                }
                Ok(Endpoint::Stdio { command })
            }
            (None, Some(url)) => {
                if !self.args.is_empty()
                    || !self.env.is_empty()
                    || !self.env_vars.is_empty()
                    || self.sandbox.is_some()
                    || self.network.is_some()
                {
                    return Err(problem(
                        "`args`, `env`, `env_vars`, `sandbox` and `network` are for `command` \
                         servers; a `url` server gets `headers`"
                            .into(),
                    ));
                }
                // Neither message quotes the URL: it may hold a secret.
                match reqwest::Url::parse(url) {
                    Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
                    Ok(parsed) => {
                        return Err(problem(format!(
                            "`url` must be an http:// or https:// URL (its scheme is `{}`)",
                            parsed.scheme()
                        )));
                    }
                    Err(e) => return Err(problem(format!("`url` is not a URL: {e}"))),
                }
                self.header_map().map_err(problem)?;
                Ok(Endpoint::Http { url })
            }
        }
    }

    /// `headers` as HTTP headers. The error names the header but never
    /// shows its value (it is often a secret).
    pub(super) fn header_map(&self) -> Result<HashMap<HeaderName, HeaderValue>, String> {
        let mut map = HashMap::new();
        for (name, value) in &self.headers {
            if let Some(reserved) = RESERVED_HEADERS
                .iter()
                .find(|reserved| reserved.eq_ignore_ascii_case(name))
            {
                return Err(format!(
                    "header `{name}` cannot be given: the MCP client sets `{reserved}` itself"
                ));
            }
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("`{name}` is not a valid HTTP header name"))?;
            let mut value = HeaderValue::from_str(value)
                .map_err(|_| format!("the value of header `{name}` is not a valid header value"))?;
            value.set_sensitive(true);
            // Names differ only in case: two keys would send one header twice.
            if map.insert(header, value).is_some() {
                return Err(format!("header `{name}` is given twice"));
            }
        }
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::McpServer;

    #[test]
    fn config_from_toml_shape() {
        let config: McpServerConfig = serde_json::from_value(serde_json::json!({
            "command": "node",
            "args": ["server.js"],
            "env": {"A": "1"}
        }))
        .unwrap_or_default();
        assert_eq!(config.command.as_deref(), Some("node"));
        assert_eq!(config.args, ["server.js"]);
        assert_eq!(config.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(
            config.endpoint().ok(),
            Some(Endpoint::Stdio { command: "node" })
        );

        let config: McpServerConfig = serde_json::from_value(serde_json::json!({
            "url": "https://mcp.example.com/mcp",
            "headers": {"Authorization": "Bearer secret"}
        }))
        .unwrap_or_default();
        assert_eq!(
            config.endpoint().ok(),
            Some(Endpoint::Http {
                url: "https://mcp.example.com/mcp"
            })
        );
        let headers = config.header_map().unwrap_or_default();
        let value = headers
            .get(&HeaderName::from_static("authorization"))
            .map(HeaderValue::as_bytes);
        assert_eq!(value, Some(&b"Bearer secret"[..]));

        let unknown = serde_json::from_value::<McpServerConfig>(serde_json::json!({
            "url": "http://localhost/mcp",
            "transport": "sse"
        }));
        assert!(unknown.is_err(), "unknown fields are still rejected");
    }

    fn config_problem(config: McpServerConfig) -> String {
        match config.validate() {
            Ok(()) => panic!("expected {config:?} to be rejected"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn a_config_names_exactly_one_way_to_reach_the_server() {
        assert!(McpServerConfig::stdio("s", "node").validate().is_ok());
        assert!(
            McpServerConfig::http("s", "http://127.0.0.1:9/mcp")
                .validate()
                .is_ok()
        );

        let both = McpServerConfig {
            url: Some("http://127.0.0.1:9/mcp".into()),
            ..McpServerConfig::stdio("both", "node")
        };
        assert_eq!(
            config_problem(both),
            "MCP server `both` is not configured right: give either `command` (a stdio \
             server) or `url` (a streamable HTTP server), not both"
        );
        assert_eq!(
            config_problem(McpServerConfig {
                name: "neither".into(),
                ..Default::default()
            }),
            "MCP server `neither` is not configured right: give `command` (a stdio server) \
             or `url` (a streamable HTTP server)"
        );
        let message = config_problem(McpServerConfig {
            args: vec!["x".into()],
            ..McpServerConfig::http("web", "http://127.0.0.1:9/mcp")
        });
        assert!(
            message.contains(
                "`args`, `env`, `env_vars`, `sandbox` and `network` are for `command` servers"
            ),
            "{message}"
        );
        let message = config_problem(McpServerConfig {
            headers: [("Authorization".into(), "Bearer x".into())].into(),
            ..McpServerConfig::stdio("local", "node")
        });
        assert!(
            message.contains("`headers` are for `url` servers"),
            "{message}"
        );
        let message = config_problem(McpServerConfig {
            network: Some(true),
            ..McpServerConfig::stdio("local", "node")
        });
        assert!(message.contains("set `sandbox` too"), "{message}");
        let message = config_problem(McpServerConfig {
            sandbox: Some(Mode::ReadOnly),
            ..McpServerConfig::http("web", "http://127.0.0.1:9/mcp")
        });
        assert!(message.contains("are for `command` servers"), "{message}");
        let message = config_problem(McpServerConfig::http("web", "ftp://example.com/mcp"));
        assert!(message.contains("http:// or https://"), "{message}");
        let message = config_problem(McpServerConfig::http("web", "not a url"));
        assert!(message.contains("is not a URL"), "{message}");
        let message = config_problem(McpServerConfig {
            headers: [("Authorization".into(), "Bearer \nsecret".into())].into(),
            ..McpServerConfig::http("web", "http://127.0.0.1:9/mcp")
        });
        assert!(
            message.contains("header `Authorization`") && !message.contains("secret"),
            "{message}"
        );
    }

    #[test]
    fn urls_are_shown_without_credentials_query_or_fragment() {
        assert_eq!(
            redact_url("https://user:pw@mcp.example.com:8443/v1/mcp?key=secret#frag"),
            "https://mcp.example.com:8443/v1/mcp"
        );
        assert_eq!(redact_url("http://[::1]/mcp?token=x"), "http://[::1]/mcp");
        assert_eq!(redact_url("not a url with secret"), "(not a URL)");

        let message = config_problem(McpServerConfig::http(
            "web",
            "ftp://user:secret@example.com/mcp?key=secret",
        ));
        assert!(
            message.contains("http:// or https://") && !message.contains("secret"),
            "{message}"
        );
        let message = config_problem(McpServerConfig::http("web", "http://[secret/mcp"));
        assert!(
            message.contains("is not a URL") && !message.contains("secret"),
            "{message}"
        );
    }

    #[test]
    fn a_config_shows_no_header_or_env_value_when_debugged() {
        let config = McpServerConfig {
            headers: [("Authorization".into(), "Bearer secret".into())].into(),
            ..McpServerConfig::http("web", "https://u:secret@example.com/mcp?key=secret")
        };
        let shown = format!(
            "{config:?} {:?}",
            McpServer::new(config.clone(), crate::mcp::Launch::unconfined())
        );
        assert!(
            shown.contains("Authorization")
                && shown.contains("https://example.com/mcp")
                && !shown.contains("secret"),
            "{shown}"
        );
        let config = McpServerConfig {
            env: [("API_KEY".into(), "secret".into())].into(),
            ..McpServerConfig::stdio("local", "node")
        };
        let shown = format!("{config:?}");
        assert!(
            shown.contains("API_KEY") && !shown.contains("secret"),
            "{shown}"
        );
    }

    #[test]
    fn headers_the_mcp_client_sets_itself_are_refused() {
        for name in ["Accept", "mcp-session-id", "LAST-EVENT-ID"] {
            let message = config_problem(McpServerConfig {
                headers: [(name.to_owned(), "x".to_owned())].into(),
                ..McpServerConfig::http("web", "http://127.0.0.1:9/mcp")
            });
            assert!(
                message.starts_with("MCP server `web` is not configured right")
                    && message.contains(&format!("header `{name}` cannot be given")),
                "{message}"
            );
        }
        let fine = McpServerConfig {
            headers: [("Mcp-Team".to_owned(), "x".to_owned())].into(),
            ..McpServerConfig::http("web", "http://127.0.0.1:9/mcp")
        };
        assert!(fine.validate().is_ok());
    }
}
