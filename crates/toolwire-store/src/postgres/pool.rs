//! Connections: the URL read into tokio-postgres's configuration, a
//! deadpool pool of connections, and their errors made into
//! [`StoreError`]s. No error shows the URL's secrets: the URL is shown
//! through [`redact_url`], and messages that quote it through [`redact_in`].

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;
use toolwire_core::redact::{redact_in, redact_url};

use crate::{Result, StoreError};

/// Connections kept open at most, across the store's methods.
const MAX_CONNECTIONS: usize = 10;

/// How long a method waits for a connection to come free or be made
/// before it fails.
const CONNECTION_WAIT: Duration = Duration::from_secs(30);

/// A pool of (at most [`MAX_CONNECTIONS`]) connections to the database
/// at `url`; none is made yet.
pub(super) fn pool(url: &str) -> Result<(Pool, tokio_postgres::Config)> {
    let config = tokio_postgres::Config::from_str(url).map_err(|e| StoreError::BadUrl {
        url: redact_url(url),
        reason: redact_in(&describe(&e), url),
    })?;
    let manager = Manager::from_config(
        config.clone(),
        NoTls,
        ManagerConfig {
            // A connection that broke is not handed out again; one that
            // fails a query otherwise has its error reported by the query.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(MAX_CONNECTIONS)
        .wait_timeout(Some(CONNECTION_WAIT))
        .create_timeout(Some(CONNECTION_WAIT))
        .runtime(Runtime::Tokio1)
        .build()
        .map(|pool| (pool, config))
        .map_err(|e| StoreError::Connection(e.to_string()))
}

/// A failure to make the first connection to `url`, as shown: which
/// database (its URL redacted) and why.
pub(super) fn first_connection_failed(e: PoolError, url: &str) -> StoreError {
    let why = match &e {
        PoolError::Backend(e) => describe(e),
        other => other.to_string(),
    };
    StoreError::Connection(format!(
        "cannot connect to {}: {}",
        redact_url(url),
        redact_in(&why, url)
    ))
}

/// `e` and what caused it: tokio-postgres shows only the kind of error
/// itself (`db error`), the server's message being its source.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Whether `e` is a unique-constraint violation.
pub(super) fn is_unique_violation(e: &StoreError) -> bool {
    matches!(e, StoreError::Postgres(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION))
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> StoreError {
        StoreError::Postgres(e)
    }
}

impl From<PoolError> for StoreError {
    fn from(e: PoolError) -> StoreError {
        match e {
            PoolError::Backend(e) => StoreError::Postgres(e),
            PoolError::Closed => StoreError::Closed,
            other => StoreError::Connection(other.to_string()),
        }
    }
}
