//! A scratch PostgreSQL database for one test or bench run: created on the
//! server an admin URL names (its user may create databases), reached by
//! its own URL, dropped afterwards, whatever the run did to it.

/// The variable that names the test PostgreSQL server (`scripts/test`
/// starts one and sets it).
pub const URL_VAR: &str = "TOOLWIRE_TEST_POSTGRES_URL";

/// The test server's admin URL, from [`URL_VAR`]; `None` (with a note)
/// when it is not set, except under CI (`CI` set), where the PostgreSQL
/// tests must run: there it panics.
pub fn admin_url() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => panic!(
            "{URL_VAR} is not set, but CI is: the PostgreSQL tests must run in CI \
             (scripts/test starts a server and sets it)"
        ),
        _ => {
            eprintln!("note: {URL_VAR} is not set; skipping a PostgreSQL test");
            None
        }
    }
}

/// A connection to `url`, driven on a task of its own.
pub async fn connect(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("a scratch PostgreSQL connection failed: {e}");
        }
    });
    Ok(client)
}

/// `url` with its database name replaced by `database`.
pub fn with_database(url: &str, database: &str) -> String {
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

/// A database of its own on a PostgreSQL server, until [`drop_it`].
///
/// [`drop_it`]: ScratchDatabase::drop_it
pub struct ScratchDatabase {
    admin: tokio_postgres::Client,
    name: String,
    url: String,
}

impl ScratchDatabase {
    /// A new, empty database on the server `admin_url` names, its name
    /// `prefix` and what makes it unique (this process, the time).
    pub async fn create(
        admin_url: &str,
        prefix: &str,
    ) -> Result<ScratchDatabase, tokio_postgres::Error> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!("{prefix}_{}_{nanos}", std::process::id());
        let admin = connect(admin_url).await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await?;
        let url = with_database(admin_url, &name);
        Ok(ScratchDatabase { admin, name, url })
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database's URL (for `toolwire serve --db`, or a store).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A new connection to the database.
    pub async fn client(&self) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        connect(&self.url).await
    }

    /// Drops the database, with whatever still holds a connection to it.
    pub async fn drop_it(self) -> Result<(), tokio_postgres::Error> {
        self.admin
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .await
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
