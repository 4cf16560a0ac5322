//! Credentials in a configured base URL (`https://user:secret@host/v1`,
//! `?key=…`) never reach an error message or a log line: every URL shown
//! goes through [`redact_url`] first.

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
    let Ok(mut parsed) = reqwest::Url::parse(url) else {
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

/// Redacts every occurrence of `url` (as given) in `text`: for messages
/// from lower layers that quote the URL themselves.
pub fn redact_in(text: &str, url: &str) -> String {
    if url.is_empty() || !text.contains(url) {
        return text.to_owned();
    }
    text.replace(url, &redact_url(url))
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
    fn quoted_urls_are_redacted_in_text() {
        let url = "https://u:pw@h.example/v1";
        let text = format!("error sending request for url ({url}): refused");
        let shown = redact_in(&text, url);
        assert!(!shown.contains("pw"), "{shown}");
        assert!(shown.contains("h.example"));
    }
}
