//! Credentials in a configured URL (a model API's base URL
//! `https://user:secret@host/v1`, `?key=…`, or a database URL
//! `postgres://user:secret@host/db`) never reach an error message or a log
//! line: every URL shown goes through [`redact_url`] first.

/// Query keys whose values are treated as secrets (matched as parts of the
/// lower-cased key: `api_key`, `x-goog-api-key`, `access_token`, `sig`…).
const SECRET_KEY_PARTS: &[&str] = &[
    "key",
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "auth",
    "sig",
    "credential",
    "session",
];

/// What replaces a secret.
const HIDDEN: &str = "REDACTED";

/// `url` without its user info and with secret-looking query values
/// replaced. Text that does not parse as a URL is not shown at all if it
/// holds a `@` or `?` (where a secret would be).
pub fn redact_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return cut_unparsed(url);
    };
    if !parsed.username().is_empty() || parsed.password().is_some() {
        // Only fails for URLs that cannot carry user info at all.
        let _ = parsed.set_username(HIDDEN);
        let _ = parsed.set_password(None);
    }
    if parsed.query().is_some() {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let v = if is_secret_key(&k) {
                    HIDDEN.to_owned()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

/// `text` with `url` and each of its secrets (user name, password,
/// secret-looking query values) replaced wherever they occur: for
/// messages from lower layers or servers that quote the URL, or part of
/// it, themselves.
pub fn redact_in(text: &str, url: &str) -> String {
    let mut out = if url.is_empty() {
        text.to_owned()
    } else {
        text.replace(url, &redact_url(url))
    };
    for secret in secrets(url) {
        out = out.replace(&secret, HIDDEN);
    }
    out
}

/// The parts of `url` that must not be shown, longest first (so that one
/// holding another is replaced whole). Very short ones are left: replacing
/// every "a" in a message would garble it and hide nothing.
fn secrets(url: &str) -> Vec<String> {
    const SHORTEST: usize = 3;
    let Ok(parsed) = url::Url::parse(url) else {
        return Vec::new();
    };
    let mut found: Vec<String> = Vec::new();
    let mut add = |raw: &str| {
        let decoded = percent_decode(raw);
        for s in [raw.to_owned(), decoded] {
            if s.len() >= SHORTEST && !found.contains(&s) {
                found.push(s);
            }
        }
    };
    add(parsed.username());
    if let Some(password) = parsed.password() {
        add(password);
    }
    for (k, v) in parsed.query_pairs() {
        if is_secret_key(&k) {
            add(&v);
        }
    }
    found.sort_by_key(|s| std::cmp::Reverse(s.len()));
    found
}

fn percent_decode(s: &str) -> String {
    let pairs = format!("x={s}");
    url::Url::parse(&format!("http://h/?{pairs}"))
        .ok()
        .and_then(|u| u.query_pairs().next().map(|(_, v)| v.into_owned()))
        .unwrap_or_else(|| s.to_owned())
}

fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_KEY_PARTS.iter().any(|part| key.contains(part))
}

/// An unparsable URL: shown only if it has no place for a secret.
fn cut_unparsed(url: &str) -> String {
    if url.contains(['@', '?']) {
        format!("(a URL that does not parse; {HIDDEN})")
    } else {
        url.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_info_is_hidden() {
        let shown = redact_url("https://user:s3cret@llm.example/v1/chat/completions");
        assert_eq!(shown, "https://REDACTED@llm.example/v1/chat/completions");
        assert!(!shown.contains("s3cret") && !shown.contains("user"));
    }

    #[test]
    fn secret_query_values_are_hidden_others_kept() {
        let shown = redact_url(
            "https://llm.example/v1?api-version=2024-06-01&key=s3cret&access_token=t0k&sig=abc",
        );
        assert_eq!(
            shown,
            "https://llm.example/v1?api-version=2024-06-01&key=REDACTED&access_token=REDACTED&sig=REDACTED"
        );
    }

    #[test]
    fn plain_urls_are_unchanged() {
        assert_eq!(
            redact_url("http://127.0.0.1:8080/v1/chat/completions"),
            "http://127.0.0.1:8080/v1/chat/completions"
        );
    }

    #[test]
    fn unparsable_text_is_cut_before_a_secret() {
        let shown = redact_url("not a url://u:p@x?key=1");
        assert!(
            !shown.contains("u:p") && !shown.contains("key=1"),
            "{shown}"
        );
    }

    #[test]
    fn secrets_quoted_apart_from_the_url_are_redacted_too() {
        let url = "https://alice:pa%24%24word@h.example/v1?key=k3y&api-version=1";
        let text = "user alice, password pa$$word, key k3y, at https://h.example/v1?key=k3y";
        let shown = redact_in(text, url);
        for secret in ["alice", "pa$$word", "k3y"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(
            shown.contains("h.example") && shown.contains("user REDACTED"),
            "{shown}"
        );
    }

    #[test]
    fn quoted_urls_are_redacted_in_text() {
        let url = "https://u:pw@h.example/v1";
        let text = format!("error sending request for url ({url}): refused");
        let shown = redact_in(&text, url);
        assert!(!shown.contains("pw"), "{shown}");
        assert!(shown.contains("h.example"));
    }
}
