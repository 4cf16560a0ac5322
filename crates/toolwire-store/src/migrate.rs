//! The bookkeeping of schema migrations, shared by both backends: which
//! migrations exist, what a database records as applied, and what is left
//! to run.
//!
//! Both backends record them in `_sqlx_migrations`, the table sqlx kept
//! them in when it ran them, with the same columns and checksums (SHA-384
//! of the file): a database made when sqlx migrated it opens with nothing
//! run again, and one migrated now still opens with a toolwire of that
//! time. Each backend creates the table in its own dialect and runs the
//! migrations in its own transactions (`sqlite/migrate.rs`,
//! `postgres/migrate.rs`).

use sha2::{Digest, Sha384};

use crate::{Result, StoreError};

/// One migration file (`migrations/sqlite/*.sql`, `migrations/postgres/*.sql`).
pub(crate) struct Migration {
    pub version: i64,
    /// As sqlx names it: the file name after the version, `_` as spaces.
    pub description: &'static str,
    pub sql: &'static str,
}

/// A migration of `migrations/$dir`, its file read at compile time.
macro_rules! migration {
    ($dir:literal, $version:literal, $description:literal, $file:literal) => {
        $crate::migrate::Migration {
            version: $version,
            description: $description,
            sql: include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/migrations/",
                $dir,
                "/",
                $file
            )),
        }
    };
}
pub(crate) use migration;

impl Migration {
    /// A migration that runs its own transactions (sqlx's marker).
    pub(crate) fn no_transaction(&self) -> bool {
        self.sql.starts_with("-- no-transaction")
    }

    /// As sqlx computes it.
    pub(crate) fn checksum(&self) -> Vec<u8> {
        Sha384::digest(self.sql.as_bytes()).to_vec()
    }

    pub(crate) fn failed(&self, reason: impl std::fmt::Display) -> StoreError {
        StoreError::Migration {
            version: self.version,
            description: self.description.to_owned(),
            reason: reason.to_string(),
        }
    }

    /// Nanoseconds since `started`, as `execution_time` records them.
    pub(crate) fn nanos_since(started: std::time::Instant) -> i64 {
        i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX)
    }
}

/// A row of `_sqlx_migrations`, as far as it is checked.
pub(crate) struct Applied {
    pub version: i64,
    pub success: bool,
    pub checksum: Vec<u8>,
}

/// The migrations of `all` that `applied` lacks, in order, after checking
/// that each applied one is known, complete and unchanged. When some were
/// applied before (a database of an older toolwire), each pending one is
/// announced.
pub(crate) fn pending<'m>(all: &'m [Migration], applied: &[Applied]) -> Result<Vec<&'m Migration>> {
    for a in applied {
        let Some(m) = all.iter().find(|m| m.version == a.version) else {
            return Err(StoreError::Migration {
                version: a.version,
                description: String::new(),
                reason: "applied to the database but unknown to this version of toolwire \
                         (made by a newer one?)"
                    .into(),
            });
        };
        if !a.success {
            return Err(m.failed(
                "it was left partly applied: repair the database and delete its row \
                 from _sqlx_migrations",
            ));
        }
        if a.checksum != m.checksum() {
            return Err(m.failed("the applied migration differs from this version's"));
        }
    }
    let pending: Vec<&Migration> = all
        .iter()
        .filter(|m| applied.iter().all(|a| a.version != m.version))
        .collect();
    if !applied.is_empty() {
        for m in &pending {
            announce(m);
        }
    }
    Ok(pending)
}

/// Says that a migration is about to run on a database that already has
/// some: on the first start of a new version, one may rebuild a table,
/// which takes a while on a large database.
fn announce(m: &Migration) {
    tracing::info!(
        version = m.version,
        "updating the database schema: {} (a large database may take a while)",
        m.description
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Migration; 2] = [
        Migration {
            version: 1,
            description: "one",
            sql: "CREATE TABLE a (x INTEGER);",
        },
        Migration {
            version: 2,
            description: "two",
            sql: "CREATE TABLE b (x INTEGER);",
        },
    ];

    fn applied(m: &Migration) -> Applied {
        Applied {
            version: m.version,
            success: true,
            checksum: m.checksum(),
        }
    }

    #[test]
    fn what_is_applied_is_not_run_again() {
        let versions = |p: Vec<&Migration>| p.iter().map(|m| m.version).collect::<Vec<_>>();
        assert_eq!(versions(pending(&ALL, &[]).unwrap()), [1, 2]);
        assert_eq!(versions(pending(&ALL, &[applied(&ALL[0])]).unwrap()), [2]);
        let both = [applied(&ALL[0]), applied(&ALL[1])];
        assert!(pending(&ALL, &both).unwrap().is_empty());
    }

    #[test]
    fn unknown_failed_or_changed_migrations_are_refused() {
        let reason = |applied: Applied| match pending(&ALL, &[applied]) {
            Err(StoreError::Migration { reason, .. }) => reason,
            other => panic!("{:?}", other.map(|p| p.len())),
        };
        let mut unknown = applied(&ALL[0]);
        unknown.version = 3;
        assert!(reason(unknown).contains("unknown to this version"));
        let mut failed = applied(&ALL[0]);
        failed.success = false;
        assert!(reason(failed).contains("partly applied"));
        let mut changed = applied(&ALL[0]);
        changed.checksum = ALL[1].checksum();
        assert!(reason(changed).contains("differs"));
    }

    /// sqlx's checksum of a file: SHA-384 of its text.
    #[test]
    fn checksums_are_sqlx_s() {
        let m = Migration {
            version: 1,
            description: "x",
            sql: "abc",
        };
        assert_eq!(
            m.checksum()[..8],
            [0xcb, 0x00, 0x75, 0x3f, 0x45, 0xa3, 0x5e, 0x8b]
        );
    }
}
