//! One store call's transaction on a connection, and how a call runs on
//! the caller's own thread without ever waiting for SQLite's locks.
//!
//! `BEGIN` and `COMMIT` are statements prepared once per connection (with
//! every other statement, in its cache): rusqlite's `Transaction` runs
//! them through `execute_batch`, which parses them on every call.

use std::time::Duration;

use rusqlite::{Connection, ErrorCode};

use super::BUSY_TIMEOUT;
use crate::{Result, StoreError};

/// Statements a connection keeps prepared: every statement the store
/// runs on it, with room to spare (rusqlite keeps 16 by default, fewer
/// than the writer uses, so that some were prepared again and again).
const PREPARED_KEPT: usize = 64;

/// How a transaction starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Begin {
    /// A read: its snapshot is taken by its first statement.
    Deferred,
    /// A write: the database's write lock taken at once.
    Immediate,
}

impl Begin {
    fn sql(self) -> &'static str {
        match self {
            Begin::Deferred => "BEGIN",
            Begin::Immediate => "BEGIN IMMEDIATE",
        }
    }
}

/// Settings every connection of the store gets when it opens.
pub(super) fn configure(conn: &Connection) -> Result<()> {
    conn.set_prepared_statement_cache_capacity(PREPARED_KEPT);
    // Without the query planner's stability guarantee, a statement whose
    // plan may depend on a bound value (a `col = ?` the index does not
    // use, a `LIMIT ?`) is marked to be prepared again when its bindings
    // are cleared, which rusqlite does each time the statement goes back
    // to its cache: such statements were prepared again on every use.
    // The store's queries are planned once, whatever their values.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

/// Runs `f` in one transaction on `conn`: committed if it succeeds,
/// rolled back if it (or the commit) fails.
pub(super) fn transaction<T>(
    conn: &Connection,
    begin: Begin,
    f: impl FnOnce(&Connection) -> Result<T>,
) -> Result<T> {
    conn.prepare_cached(begin.sql())?.execute([])?;
    let done = f(conn).and_then(|value| {
        conn.prepare_cached("COMMIT")?.execute([])?;
        Ok(value)
    });
    if done.is_err() && !conn.is_autocommit() {
        // As rusqlite's `Transaction` does when dropped. A rollback that
        // fails leaves the connection in its transaction: the writer
        // rolls back or reopens such a connection before its next
        // write; a reader's is not reused after a failure.
        let rolled_back = conn
            .prepare_cached("ROLLBACK")
            .and_then(|mut rollback| rollback.execute([]));
        if let Err(e) = rolled_back {
            tracing::debug!(error = %e, "rollback failed");
        }
    }
    done
}

/// Runs `f` on `conn` with no busy handler: where SQLite would wait for
/// another connection's lock, it fails at once with `SQLITE_BUSY` (see
/// [`is_busy`]), for the caller to try again where waiting is allowed.
pub(super) fn without_waiting<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T>,
) -> Result<T> {
    conn.busy_timeout(Duration::ZERO)?;
    let done = f(conn);
    let restored = conn.busy_timeout(BUSY_TIMEOUT);
    let value = done?;
    restored?;
    Ok(value)
}

/// Whether `e` is SQLite giving up on a lock another connection holds.
pub(super) fn is_busy(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Sqlite(rusqlite::Error::SqliteFailure(f, _)) if f.code == ErrorCode::DatabaseBusy
    )
}

#[cfg(test)]
mod tests {
    use rusqlite::StatementStatus;

    use super::*;

    /// How many times a cached `SELECT` was prepared again over ten
    /// uses, each with other values: a table and query shaped as the
    /// store's documents and their list (an index the `WHERE` uses, the
    /// rows ordered by another column).
    fn reprepared(conn: &Connection) -> i32 {
        const SELECT: &str = "SELECT id FROM d WHERE kind = ?1 ORDER BY created_at, id";
        conn.execute_batch(
            "CREATE TABLE d (kind TEXT NOT NULL, id TEXT NOT NULL, created_at TEXT NOT NULL, \
             PRIMARY KEY (kind, id));
             CREATE INDEX d_oldest ON d (kind, created_at);
             INSERT INTO d VALUES ('agent', 'a', '1'), ('tool', 't', '2');",
        )
        .unwrap();
        for i in 0..10 {
            let kind = if i % 2 == 0 { "agent" } else { "tool" };
            let ids: Vec<String> = conn
                .prepare_cached(SELECT)
                .unwrap()
                .query_map([kind], |r| r.get(0))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            assert_eq!(ids.len(), 1);
        }
        conn.prepare_cached(SELECT)
            .unwrap()
            .get_status(StatementStatus::RePrepare)
    }

    /// The cause of the statements prepared again on every use (rusqlite
    /// clears a cached statement's bindings, and SQLite marks a statement
    /// whose plan may depend on them to be prepared again then), and
    /// that [`configure`] stops it.
    #[test]
    fn cached_statements_are_not_prepared_again() {
        let plain = Connection::open_in_memory().unwrap();
        let times = reprepared(&plain);
        assert!(
            times >= 9,
            "prepared again {times} times: the cause has gone"
        );
        let configured = Connection::open_in_memory().unwrap();
        configure(&configured).unwrap();
        assert_eq!(reprepared(&configured), 0);
    }

    /// A transaction that fails is rolled back, and the connection is
    /// out of it; one that succeeds is committed.
    #[test]
    fn transactions_commit_or_roll_back() {
        let conn = Connection::open_in_memory().unwrap();
        configure(&conn).unwrap();
        conn.execute_batch("CREATE TABLE t (a INTEGER PRIMARY KEY)")
            .unwrap();
        transaction(&conn, Begin::Immediate, |tx| {
            tx.execute("INSERT INTO t VALUES (1)", [])?;
            Ok(())
        })
        .unwrap();
        let failed = transaction(&conn, Begin::Immediate, |tx| {
            tx.execute("INSERT INTO t VALUES (2)", [])?;
            tx.execute("INSERT INTO t VALUES (1)", [])?;
            Ok(())
        });
        assert!(failed.is_err());
        assert!(conn.is_autocommit());
        let rows: Vec<i64> = conn
            .prepare("SELECT a FROM t")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(rows, [1]);
    }
}
