//! The PostgreSQL schema's migrations, run on one connection; their
//! bookkeeping is [`crate::migrate`]'s. As sqlx did, they run under a
//! session advisory lock with sqlx's key, so that instances starting at
//! once (an older toolwire among them) migrate one after another.

use std::time::Instant;

use deadpool_postgres::{Client, GenericClient};

use super::pool::describe;
use crate::Result;
use crate::migrate::{self, Applied, Migration, migration};

/// Every migration, in order.
const MIGRATIONS: [Migration; 8] = [
    migration!("postgres", 1, "schema", "0001_schema.sql"),
    migration!("postgres", 2, "run owner", "0002_run_owner.sql"),
    migration!("postgres", 3, "documents", "0003_documents.sql"),
    migration!("postgres", 5, "blobs", "0005_blobs.sql"),
    migration!(
        "postgres",
        9,
        "cluster commands",
        "0009_cluster_commands.sql"
    ),
    migration!(
        "postgres",
        12,
        "cache write tokens",
        "0012_cache_write_tokens.sql"
    ),
    migration!(
        "postgres",
        13,
        "conversation unfinished runs",
        "0013_conversation_unfinished_runs.sql"
    ),
    migration!(
        "postgres",
        14,
        "conversation revision",
        "0014_conversation_revision.sql"
    ),
];

/// sqlx's table, as sqlx creates it on PostgreSQL.
const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS _sqlx_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMPTZ NOT NULL DEFAULT now(),
    success BOOLEAN NOT NULL,
    checksum BYTEA NOT NULL,
    execution_time BIGINT NOT NULL
)";

/// Records a migration; one that runs its own transactions may have been
/// recorded meanwhile by an instance that did not take the lock.
const RECORD: &str = "INSERT INTO _sqlx_migrations \
    (version, description, success, checksum, execution_time) VALUES ($1, $2, TRUE, $3, $4) \
    ON CONFLICT (version) DO NOTHING";

/// Brings the database on `client` up to the last migration.
pub(super) async fn run(client: &mut Client) -> Result<()> {
    let database: String = client
        .query_one("SELECT current_database()", &[])
        .await?
        .try_get(0)?;
    let key = lock_key(&database);
    client
        .execute("SELECT pg_advisory_lock($1)", &[&key])
        .await?;
    let migrated = migrate(client).await;
    // Unlocked even when a migration failed: the connection goes back to
    // the pool.
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&key])
        .await;
    migrated?;
    unlocked?;
    Ok(())
}

async fn migrate(client: &mut Client) -> Result<()> {
    client.batch_execute(CREATE_TABLE).await?;
    let applied = client
        .query(
            "SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version",
            &[],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(Applied {
                version: r.try_get(0)?,
                success: r.try_get(1)?,
                checksum: r.try_get(2)?,
            })
        })
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
    for m in migrate::pending(&MIGRATIONS, &applied)? {
        apply(client, m).await?;
    }
    Ok(())
}

async fn apply(client: &mut Client, m: &Migration) -> Result<()> {
    let started = Instant::now();
    if m.no_transaction() {
        client
            .batch_execute(m.sql)
            .await
            .map_err(|e| m.failed(describe(&e)))?;
        return record(&*client, m, started).await;
    }
    let tx = client.transaction().await?;
    tx.batch_execute(m.sql)
        .await
        .map_err(|e| m.failed(describe(&e)))?;
    record(&tx, m, started).await?;
    tx.commit().await?;
    Ok(())
}

async fn record(c: &impl GenericClient, m: &Migration, started: Instant) -> Result<()> {
    let nanos = Migration::nanos_since(started);
    c.execute(RECORD, &[&m.version, &m.description, &m.checksum(), &nanos])
        .await?;
    Ok(())
}

/// sqlx's advisory lock key for a database: the database name's CRC-32
/// times a constant (sqlx's `generate_lock_id`).
fn lock_key(database: &str) -> i64 {
    const CRC_32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
    0x3d32_ad9e * i64::from(CRC_32.checksum(database.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key sqlx takes (its `generate_lock_id`), for two names: the
    /// CRC-32 of "123456789" is the standard check value 0xCBF43926.
    #[test]
    fn the_lock_key_is_sqlx_s() {
        assert_eq!(lock_key("123456789"), 0x3d32_ad9e * 0xCBF4_3926);
        assert_eq!(lock_key(""), 0);
    }
}
