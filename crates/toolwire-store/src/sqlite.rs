//! The SQLite backend: one file (`sqlite://PATH`, created if missing) in
//! WAL mode, or `sqlite::memory:` for throwaway stores.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

/// How long a writer waits for another one before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// A [`Store`](crate::Store) in an SQLite database.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating and migrating if needed) the database at `url`.
    pub async fn open(url: &str) -> crate::Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        // An in-memory database lives as long as its last connection, and
        // its shared cache does not wait for locks: keep exactly one.
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let pool = if in_memory {
            SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
        } else {
            SqlitePoolOptions::new().max_connections(8)
        }
        .connect_with(options)
        .await?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        Ok(SqliteStore { pool })
    }

    /// Closes the connections (waiting for the ones in use).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

crate::sql::impl_store!(SqliteStore, sqlx::Sqlite, begin_write = "BEGIN IMMEDIATE");
