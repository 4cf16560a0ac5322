//! What the load benches read of their scratch PostgreSQL database
//! (toolwire-test-support's [`ScratchDatabase`]) behind the servers' API.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use toolwire_test_support::ScratchDatabase;

/// A new scratch database on the server `admin_url` names.
pub(crate) async fn create(admin_url: &str) -> Result<ScratchDatabase> {
    ScratchDatabase::create(admin_url, "tw_bench")
        .await
        .context("creating a scratch database (its user must be allowed to)")
}

/// Drops `db`, saying so when it cannot.
pub(crate) async fn drop_it(db: ScratchDatabase) {
    let name = db.name().to_owned();
    if let Err(e) = db.drop_it().await {
        eprintln!("could not drop the scratch database {name}: {e}");
    }
}

/// Runs in `db` not finished yet, once none is left or `within` has passed.
pub(crate) async fn unfinished_runs(db: &ScratchDatabase, within: Duration) -> Result<i64> {
    let client = db.client().await.context("connecting to PostgreSQL")?;
    let deadline = Instant::now() + within;
    loop {
        let n: i64 = client
            .query_one("SELECT count(*) FROM runs WHERE stop_reason IS NULL", &[])
            .await?
            .get(0);
        if n == 0 || Instant::now() > deadline {
            return Ok(n);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
