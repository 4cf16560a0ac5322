//! A scratch PostgreSQL database for one bench run: created on the server
//! a URL names (its user may create databases), dropped afterwards.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

pub(crate) struct ScratchDatabase {
    admin: tokio_postgres::Client,
    name: String,
    /// The scratch database's URL, for `toolwire serve --db`.
    pub(crate) url: String,
}

async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .context("connecting to PostgreSQL")?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("a PostgreSQL connection of the bench failed: {e}");
        }
    });
    Ok(client)
}

/// `url` with its database name replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let authority = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[authority..]
        .find('/')
        .map_or(base.len(), |i| authority + i);
    format!("{}/{database}{query}", &base[..host_end])
}

impl ScratchDatabase {
    /// A new database on the server `admin_url` names.
    pub(crate) async fn create(admin_url: &str) -> Result<ScratchDatabase> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!("tw_bench_{}_{nanos}", std::process::id());
        let admin = connect(admin_url).await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .with_context(|| format!("creating the scratch database {name}"))?;
        let url = with_database(admin_url, &name);
        Ok(ScratchDatabase { admin, name, url })
    }

    /// Runs not finished yet, once none is left or `within` has passed.
    pub(crate) async fn unfinished_runs(&self, within: Duration) -> Result<i64> {
        let db = connect(&self.url).await?;
        let deadline = Instant::now() + within;
        loop {
            let n: i64 = db
                .query_one("SELECT count(*) FROM runs WHERE stop_reason IS NULL", &[])
                .await?
                .get(0);
            if n == 0 || Instant::now() > deadline {
                return Ok(n);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) async fn drop_it(self) {
        if let Err(e) = self
            .admin
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .await
        {
            eprintln!("could not drop the scratch database {}: {e}", self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_name_is_replaced() {
        assert_eq!(
            with_database("postgres://u:p@127.0.0.1:5432/postgres", "x"),
            "postgres://u:p@127.0.0.1:5432/x"
        );
        assert_eq!(
            with_database("postgres://u@h/postgres?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
    }
}
