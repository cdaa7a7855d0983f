//! A fenced write to PostgreSQL: the database refuses a deposed leader's
//! write. Leader `a` is elected through the PostgreSQL lease store and
//! writes; it stalls past its lease; `b` is elected with a higher token and
//! writes; `a` wakes up and writes with its old token, and PostgreSQL
//! refuses it (`leasehold::fence::postgres`), keeping `b`'s write.
//!
//! DATABASE_URL=postgres://user:password@localhost/db cargo run --example fenced-write

use std::time::Duration;

use leasehold::fence::{Fence, FenceError};
use leasehold::lease::{FencingToken, LeaseStore, StoreError};
use leasehold::store::postgres::{PostgresConfig, PostgresStore};
use leasehold::store::{DEFAULT_TABLE, StoreUrl};

const LOCK: &str = "orders";
const LEASE: Duration = Duration::from_secs(1);

/// The guarded write: the owner of order 1, in one transaction with the
/// fence's advance.
async fn write_owner(client: &mut tokio_postgres::Client, token: FencingToken, owner: &str) -> Result<(), FenceError> {
    // The fence names the store that issued the token: tokens of different
    // stores are not comparable.
    let fence = Fence::new("postgres", LOCK, token)?;
    leasehold::fence::postgres::fenced(client, leasehold::fence::postgres::DEFAULT_TABLE, &fence, async |tx| {
        tx.execute(
            "INSERT INTO orders (id, owner) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET owner = excluded.owner",
            &[&owner],
        )
        .await
        .map(drop)
    })
    .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL to a PostgreSQL URL")?;
    let store = PostgresStore::connect(PostgresConfig {
        url: StoreUrl::new(url.clone()),
        table: DEFAULT_TABLE.into(),
    })?;
    store.ensure_schema().await?;
    let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    leasehold::fence::postgres::ensure_table(&client, leasehold::fence::postgres::DEFAULT_TABLE).await?;
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS orders (id INT PRIMARY KEY, owner TEXT NOT NULL)")
        .await?;

    let a = store.acquire(LOCK, "a", LEASE).await?;
    write_owner(&mut client, a.token, "a").await?;
    println!("a leads with token {} and writes", a.token);

    // a stalls and renews nothing; b campaigns until a's lease has expired
    // by the database's clock.
    let b = loop {
        match store.acquire(LOCK, "b", LEASE).await {
            Ok(grant) => break grant,
            Err(StoreError::Lost { .. }) => tokio::time::sleep(LEASE / 4).await,
            Err(e) => return Err(e.into()),
        }
    };
    write_owner(&mut client, b.token, "b").await?;
    println!("b leads with token {} and writes", b.token);

    match write_owner(&mut client, a.token, "a").await {
        Err(refused @ FenceError::Stale { .. }) => println!("a wakes up and writes: {refused}"),
        other => return Err(format!("a's stale write was not refused: {other:?}").into()),
    }
    let owner: String = client
        .query_one("SELECT owner FROM orders WHERE id = 1", &[])
        .await?
        .get(0);
    println!("order 1 is still b's: owner = {owner}");
    store.release(LOCK, "b", b.token).await?;
    Ok(())
}
