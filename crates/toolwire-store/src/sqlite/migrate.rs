//! The SQLite schema's migrations, run by rusqlite; their bookkeeping is
//! [`crate::migrate`]'s.

use std::time::Instant;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use crate::Result;
use crate::migrate::{self, Applied, Migration, migration};

/// Every migration, in order.
pub(crate) const MIGRATIONS: [Migration; 5] = [
    migration!("sqlite", 1, "schema", "0001_schema.sql"),
    migration!("sqlite", 2, "run owner", "0002_run_owner.sql"),
    migration!("sqlite", 3, "documents", "0003_documents.sql"),
    migration!("sqlite", 4, "message fields", "0004_message_fields.sql"),
    migration!("sqlite", 5, "blobs", "0005_blobs.sql"),
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
    if m.no_transaction() {
        // It runs its own transactions, and does the same again if it is
        // run again (after a crash before it was recorded, or by another
        // process starting at the same moment).
        if recorded(conn, m)? {
            return Ok(());
        }
        conn.execute_batch(m.sql).map_err(|e| m.failed(e))?;
        conn.execute(
            &RECORD.replace("INSERT INTO", "INSERT OR IGNORE INTO"),
            (
                m.version,
                m.description,
                m.checksum(),
                Migration::nanos_since(started),
            ),
        )?;
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Another process may have run it since we looked.
    if !recorded(&tx, m)? {
        tx.execute_batch(m.sql).map_err(|e| m.failed(e))?;
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
