//! The SQLite schema's migrations, run by rusqlite; their bookkeeping is
//! [`crate::migrate`]'s.

use std::time::Instant;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use crate::Result;
use crate::migrate::{self, Applied, Migration, migration};

/// Every migration, in order.
pub(crate) const MIGRATIONS: [Migration; 8] = [
    migration!("sqlite", 1, "schema", "0001_schema.sql"),
    migration!("sqlite", 2, "run owner", "0002_run_owner.sql"),
    migration!("sqlite", 3, "documents", "0003_documents.sql"),
    migration!("sqlite", 4, "message fields", "0004_message_fields.sql"),
    migration!("sqlite", 5, "blobs", "0005_blobs.sql"),
    migration!(
        "sqlite",
        12,
        "cache write tokens",
        "0012_cache_write_tokens.sql"
    ),
    migration!(
        "sqlite",
        13,
        "conversation unfinished runs",
        "0013_conversation_unfinished_runs.sql"
    ),
    migration!(
        "sqlite",
        14,
        "conversation revision",
        "0014_conversation_revision.sql"
    ),
];

/// sqlx's table, as sqlx creates it on SQLite.
const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS _sqlx_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    success BOOLEAN NOT NULL,
    checksum BLOB NOT NULL,
    execution_time BIGINT NOT NULL
)";

const RECORD: &str = "INSERT INTO _sqlx_migrations \
    (version, description, success, checksum, execution_time) VALUES (?1, ?2, TRUE, ?3, ?4)";

/// Brings the database on `conn` up to the last migration.
pub(crate) fn run(conn: &mut Connection) -> Result<()> {
    conn.execute_batch(CREATE_TABLE)?;
    let applied: Vec<Applied> = conn
        .prepare("SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version")?
        .query_map([], |r| {
            Ok(Applied {
                version: r.get(0)?,
                success: r.get(1)?,
                checksum: r.get(2)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    for m in migrate::pending(&MIGRATIONS, &applied)? {
        apply(conn, m)?;
    }
    Ok(())
}

fn apply(conn: &mut Connection, m: &Migration) -> Result<()> {
    let started = Instant::now();
    // A no-transaction migration (a table rebuilt with foreign keys off)
    // runs its own `BEGIN IMMEDIATE; … COMMIT;` under sqlx. Here its
    // parts around that block run as written and the block itself in the
    // write transaction that checks the record, as every migration does:
    // two processes starting at once must not run an older rebuild after
    // a newer one, which would undo it.
    let (before, body, after) = if m.no_transaction() {
        split(m.sql).ok_or_else(|| {
            m.failed(
                "a no-transaction migration must hold one `BEGIN IMMEDIATE;` … `COMMIT;` block",
            )
        })?
    } else {
        ("", m.sql, "")
    };
    conn.execute_batch(before).map_err(|e| m.failed(e))?;
    let applied = (|| {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Another process may have run it since we looked.
        if !recorded(&tx, m)? {
            tx.execute_batch(body).map_err(|e| m.failed(e))?;
            tx.execute(
                RECORD,
                (
                    m.version,
                    m.description,
                    m.checksum(),
                    Migration::nanos_since(started),
                ),
            )?;
        }
        tx.commit()?;
        Ok(())
    })();
    // Foreign keys back on whatever happened.
    let restored = conn.execute_batch(after).map_err(|e| m.failed(e));
    applied.and(restored)
}

/// A no-transaction migration's text before its `BEGIN IMMEDIATE;` line,
/// between it and its `COMMIT;` line, and after.
fn split(sql: &str) -> Option<(&str, &str, &str)> {
    let begin = sql.find("\nBEGIN IMMEDIATE;\n")?;
    let body = begin + "\nBEGIN IMMEDIATE;\n".len();
    let commit = body + sql[body..].find("\nCOMMIT;\n")?;
    let after = commit + "\nCOMMIT;\n".len();
    Some((&sql[..begin], &sql[body..commit], &sql[after..]))
}

/// Whether `m` is recorded as applied.
fn recorded(conn: &Connection, m: &Migration) -> Result<bool> {
    Ok(conn
        .query_row(
            "SELECT 1 FROM _sqlx_migrations WHERE version = ?1",
            [m.version],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A turn's start reads its conversation's unfinished runs through
    /// their own index, in its order: neither every run of the
    /// conversation nor every unfinished run is visited, nothing sorted.
    #[test]
    fn a_conversations_unfinished_runs_are_read_through_their_index() {
        let mut conn = Connection::open_in_memory().unwrap();
        run(&mut conn).unwrap();
        let plan: Vec<String> = conn
            .prepare(&format!(
                "EXPLAIN QUERY PLAN {}",
                crate::sql::CONVERSATION_UNFINISHED_RUNS
            ))
            .unwrap()
            .query_map([vec![0u8; 16]], |r| r.get(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(
            plan[0].contains("USING INDEX runs_conversation_running (conversation_id=?)"),
            "{plan:?}"
        );
        assert!(!plan.iter().any(|step| step.contains("B-TREE")), "{plan:?}");
    }
}
