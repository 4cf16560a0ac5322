//! `Retry-After` read without trusting it: seconds (an integer, or the
//! fractions some servers send) or an HTTP date, saturating instead of
//! overflowing (`inf`, `1e300`, a date in year 9999 are "very long", never
//! a panic), and judged against a cap by the caller.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// What a `Retry-After` header asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum RetryAfter {
    /// Wait this long (saturated at `Duration::MAX`).
    Wait(Duration),
    /// The header is there but means nothing we can read; the backoff
    /// decides.
    Unreadable,
}

/// Parses a `Retry-After` value as seen at `now` (for the date form).
pub(crate) fn parse(value: &str, now: DateTime<Utc>) -> RetryAfter {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return match seconds {
            s if s.is_nan() => RetryAfter::Unreadable,
            s if s <= 0.0 => RetryAfter::Wait(Duration::ZERO),
            // Saturates: inf and 1e300 become Duration::MAX.
            s => RetryAfter::Wait(Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)),
        };
    }
    match DateTime::parse_from_rfc2822(value) {
        Ok(at) => {
            let wait = at.with_timezone(&Utc).signed_duration_since(now);
            // A date in the past means now; a far one saturates.
            RetryAfter::Wait(wait.to_std().unwrap_or(Duration::ZERO))
        }
        Err(_) => RetryAfter::Unreadable,
    }
}

/// A duration for messages: whole seconds, or "forever" for the
/// saturated values nobody means literally.
pub(crate) fn describe(wait: Duration) -> String {
    if wait >= Duration::from_secs(u64::from(u32::MAX)) {
        "an unbounded time".to_owned()
    } else {
        format!("{:.0} s", wait.as_secs_f64().ceil())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn seconds_integer_and_fraction() {
        assert_eq!(parse("2", now()), RetryAfter::Wait(Duration::from_secs(2)));
        assert_eq!(
            parse(" 0.5 ", now()),
            RetryAfter::Wait(Duration::from_millis(500))
        );
        assert_eq!(parse("-3", now()), RetryAfter::Wait(Duration::ZERO));
    }

    #[test]
    fn huge_values_saturate_instead_of_panicking() {
        for v in ["inf", "Infinity", "1e300", "18446744073709551616"] {
            match parse(v, now()) {
                RetryAfter::Wait(d) => assert!(d > Duration::from_secs(3600 * 24 * 365), "{v}"),
                other => panic!("{v}: {other:?}"),
            }
        }
        assert_eq!(parse("NaN", now()), RetryAfter::Unreadable);
        assert_eq!(describe(Duration::MAX), "an unbounded time");
    }

    #[test]
    fn http_dates() {
        assert_eq!(
            parse("Thu, 01 Jan 2026 00:00:30 GMT", now()),
            RetryAfter::Wait(Duration::from_secs(30))
        );
        assert_eq!(
            parse("Wed, 31 Dec 2025 23:00:00 GMT", now()),
            RetryAfter::Wait(Duration::ZERO)
        );
        match parse("Fri, 31 Dec 9999 23:59:59 GMT", now()) {
            RetryAfter::Wait(d) => assert!(d > Duration::from_secs(3600)),
            other => panic!("{other:?}"),
        }
        assert_eq!(parse("soon", now()), RetryAfter::Unreadable);
    }
}
