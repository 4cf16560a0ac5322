//! The PostgreSQL backend, for several toolwire instances sharing one
//! database (`postgres://…`).

use sqlx::postgres::{PgPool, PgPoolOptions};

/// A [`Store`](crate::Store) in a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects to the database at `url` and migrates it.
    pub async fn open(url: &str) -> crate::Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .connect(url)
            .await?;
        crate::migrate!(&pool, "./migrations/postgres")?;
        Ok(PostgresStore { pool })
    }

    /// Closes the connections (waiting for the ones in use).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// [`Store::path_to`](crate::Store::path_to).
    async fn read_path(
        &self,
        leaf: toolwire_core::MessageId,
    ) -> crate::Result<Vec<toolwire_core::Message>> {
        let mut conn = self.pool.acquire().await?;
        Self::path(&mut conn, leaf).await
    }
}

crate::sql::impl_store!(PostgresStore, sqlx::Postgres, begin_write = "BEGIN");
