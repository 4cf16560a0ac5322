//! The SQLite schema's migrations, run by rusqlite.
//!
//! They are recorded in `_sqlx_migrations`, the table sqlx kept them in
//! when it ran them, with the same columns and checksums (SHA-384 of the
//! file): a database made before rusqlite ran them opens with nothing run
//! again, and one migrated here still opens with a toolwire of that time.

use std::time::Instant;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use sha2::{Digest, Sha384};

use crate::{Result, StoreError};

/// One file of `migrations/sqlite`.
pub(crate) struct Migration {
    pub version: i64,
    /// As sqlx names it: the file name after the version, `_` as spaces.
    pub description: &'static str,
    pub sql: &'static str,
}

impl Migration {
    /// A migration that runs its own transactions (sqlx's marker).
    fn no_transaction(&self) -> bool {
        self.sql.starts_with("-- no-transaction")
    }

    pub(crate) fn checksum(&self) -> Vec<u8> {
        Sha384::digest(self.sql.as_bytes()).to_vec()
    }

    fn failed(&self, reason: impl std::fmt::Display) -> StoreError {
        StoreError::SqliteMigration {
            version: self.version,
            description: self.description.to_owned(),
            reason: reason.to_string(),
        }
    }
}

macro_rules! migration {
    ($version:literal, $description:literal, $file:literal) => {
        Migration {
            version: $version,
            description: $description,
            sql: include_str!(concat!("../../migrations/sqlite/", $file)),
        }
    };
}

/// Every migration, in order.
pub(crate) const MIGRATIONS: [Migration; 5] = [
    migration!(1, "schema", "0001_schema.sql"),
    migration!(2, "run owner", "0002_run_owner.sql"),
    migration!(3, "documents", "0003_documents.sql"),
    migration!(4, "message fields", "0004_message_fields.sql"),
    migration!(5, "blobs", "0005_blobs.sql"),
];

/// sqlx's table, as sqlx creates it.
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
    let applied: Vec<(i64, bool, Vec<u8>)> = conn
        .prepare("SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (version, success, checksum) in &applied {
        let Some(m) = MIGRATIONS.iter().find(|m| m.version == *version) else {
            return Err(StoreError::SqliteMigration {
                version: *version,
                description: String::new(),
                reason: "applied to the database but unknown to this version of toolwire \
                         (made by a newer one?)"
                    .into(),
            });
        };
        if !success {
            return Err(m.failed(
                "it was left partly applied: repair the database and delete its row \
                 from _sqlx_migrations",
            ));
        }
        if *checksum != m.checksum() {
            return Err(m.failed("the applied migration differs from this version's"));
        }
    }
    for m in MIGRATIONS
        .iter()
        .filter(|m| applied.iter().all(|(v, ..)| *v != m.version))
    {
        if !applied.is_empty() {
            crate::announce_migration(m.version, m.description);
        }
        apply(conn, m)?;
    }
    Ok(())
}

fn apply(conn: &mut Connection, m: &Migration) -> Result<()> {
    let started = Instant::now();
    let nanos = || i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX);
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
            (m.version, m.description, m.checksum(), nanos()),
        )?;
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Another process may have run it since we looked.
    if !recorded(&tx, m)? {
        tx.execute_batch(m.sql).map_err(|e| m.failed(e))?;
        tx.execute(RECORD, (m.version, m.description, m.checksum(), nanos()))?;
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
