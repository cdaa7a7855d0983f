//! Fenced writes racing on real servers (issue 56, "Races the sequential
//! tests skip"): deposed and new leaders write through `leasehold::fence` at
//! the same time, many rounds, on a private PostgreSQL, a private Redis and
//! the Spanner emulator; and Redis tokens of different lengths.
//!
//! A round: writers of two or three generations (tokens t₀ < t₁ [< t₂], one
//! to three writers each, so two to nine at once) are released together by a
//! barrier, in a shuffled order and after a few random yields, on a
//! multi-threaded runtime; t₀ is the token the fence already holds (the
//! leader of the round before, now deposed), the others newer leaders'.
//! Every write appends a record of itself to a history the store keeps (a
//! table row in the transaction, a key the script sets) and sets the
//! resource to itself. After the round the checker reads what the *store*
//! recorded, in the store's order, and requires:
//!
//! * the tokens of the accepted writes never decrease in the store's order
//!   (no lower token accepted after a higher one);
//! * a write the helper said it accepted is in the history, a write it
//!   refused is not, and each refusal is `Stale` naming its own token and a
//!   higher one the store accepted in this round;
//! * every write of the newest generation is accepted (a leader is never
//!   refused its own token, nor by an older one);
//! * the resource holds the last accepted write, of the newest token, and
//!   the fence that token.
//!
//! Tokens cross decimal lengths (9 → 10, 999 → 1000, …) and a fresh lock (a
//! missing fence row or key: the first writes race to create it) begins each
//! time tokens pass 10^18. What each store does under contention:
//! PostgreSQL's fence row lock (in half the rounds the first writer past the
//! fence holds its transaction open until every other writer of the round
//! waits on a lock, by `pg_stat_activity`, and none may finish meanwhile),
//! Spanner's abort and retry (the emulator aborts a read-write transaction
//! that overlaps another; the client runs it again), Redis' atomic script.
//!
//! The seed is random and printed; `LEASEHOLD_RACE_SEED=<n>` repeats a run's
//! choices (the interleaving itself is the machine's).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use leasehold::fence::{Fence, FenceError};
use leasehold::lease::FencingToken;
use leasehold::testing::Emulator;
use leasehold::testing::servers::{PostgresServer, RedisServer};
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::sync::{Barrier, mpsc};

/// At most three generations of at most three writers.
const WRITERS: usize = 9;
/// Where tokens stop growing and a fresh lock begins.
const FRESH_LOCK_AT: i64 = 1_000_000_000_000_000_000;

/// One write attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Write {
    round: u32,
    /// Which writer (of the pool) made it.
    writer: usize,
    token: i64,
}

impl Write {
    /// What the store records of it.
    fn tag(&self) -> String {
        format!("r{}w{}t{}", self.round, self.writer, self.token)
    }
}

/// One round, as the writers see it.
struct Round {
    number: u32,
    /// The pool indices writing in this round.
    writers: Vec<usize>,
    /// Whether the first writer past the fence holds it until the others
    /// wait (PostgreSQL).
    pileup: bool,
    /// Taken by the first writer past the fence in a pile-up round.
    holder: AtomicBool,
    /// Writes of this round that returned.
    finished: AtomicUsize,
}

/// A connection of one writer.
#[async_trait]
trait Writer: Send {
    /// Appends `write` to the store's history and sets the resource to it,
    /// through the store's fence helper.
    async fn write(&mut self, fence: &Fence, write: &Write, round: &Round) -> Result<(), FenceError>;
}

/// A store with a fenced resource and a history.
#[async_trait]
trait Track: Send {
    fn issuer(&self) -> &'static str;
    async fn writers(&mut self) -> Vec<Box<dyn Writer>>;
    /// The tags of `lock`'s accepted writes of `round`, in the order the
    /// store applied them.
    async fn accepted(&mut self, lock: &str, round: u32) -> Vec<String>;
    /// The tag the resource of `lock` holds.
    async fn current(&mut self, lock: &str) -> Option<String>;
    /// The token `lock`'s fence holds.
    async fn fence_token(&mut self, lock: &str) -> Option<i64>;
}

/// What a run did, for the report and for the check that both sides of
/// the race happened.
#[derive(Debug, Default)]
struct Tally {
    rounds: u32,
    locks: u32,
    attempts: usize,
    accepted: usize,
    /// Writes of an older generation accepted (they reached the store
    /// before any newer token) and refused.
    deposed_accepted: usize,
    deposed_refused: usize,
    /// Consecutive tokens of different decimal lengths.
    length_crossings: usize,
    pileups: u32,
}

/// The next token after `t`: one more, a random step, the next power of ten
/// or one below it, so that consecutive tokens often differ in length.
fn next_token(rng: &mut StdRng, t: i64) -> i64 {
    let power = (1..=18).map(|k| 10_i64.pow(k)).find(|&p| p > t);
    match (rng.random_range(0..4), power) {
        (0, _) => t + 1,
        (2, Some(p)) => p,
        (3, Some(p)) if p - 1 > t => p - 1,
        _ => t + rng.random_range(1..=t.max(1)),
    }
}

/// An error with its causes.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        text += &format!(": {next}");
        cause = next.source();
    }
    text
}

fn digits(t: i64) -> usize {
    t.to_string().len()
}

/// Runs `rounds` rounds on `track` and checks each (the module docs).
async fn race(track: &mut dyn Track, rounds: u32, pileups: bool) -> Tally {
    let seed = std::env::var("LEASEHOLD_RACE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let issuer = track.issuer();
    eprintln!("{issuer}: LEASEHOLD_RACE_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut pool: Vec<Option<Box<dyn Writer>>> = track.writers().await.into_iter().map(Some).collect();
    assert_eq!(pool.len(), WRITERS);
    let mut tally = Tally::default();
    let mut lock = String::new();
    // The token the fence holds, once the lock has one.
    let mut held: i64 = FRESH_LOCK_AT;
    let started = Instant::now();
    for number in 0..rounds {
        if held >= FRESH_LOCK_AT {
            tally.locks += 1;
            lock = format!("race-{}", tally.locks);
            held = rng.random_range(0..=100);
        }
        let context = format!("{issuer}, seed {seed}, round {number}, lock {lock:?}");
        let generations = rng.random_range(2..=3);
        let mut tokens = vec![held];
        for _ in 1..generations {
            let next = next_token(&mut rng, *tokens.last().unwrap());
            tokens.push(next);
        }
        tally.length_crossings += tokens.windows(2).filter(|w| digits(w[0]) != digits(w[1])).count();
        let top = *tokens.last().unwrap();
        let mut writers: Vec<usize> = (0..WRITERS).collect();
        writers.shuffle(&mut rng);
        let mut writes = Vec::new();
        for &token in &tokens {
            for _ in 0..rng.random_range(1..=3) {
                writes.push(Write {
                    round: number,
                    writer: writers[writes.len()],
                    token,
                });
            }
        }
        writes.shuffle(&mut rng);
        let round = Arc::new(Round {
            number,
            writers: writes.iter().map(|w| w.writer).collect(),
            pileup: pileups && rng.random_bool(0.5),
            holder: AtomicBool::new(false),
            finished: AtomicUsize::new(0),
        });
        tally.pileups += u32::from(round.pileup);
        let barrier = Arc::new(Barrier::new(writes.len()));
        let mut tasks = Vec::new();
        for write in writes {
            let mut writer = pool[write.writer].take().unwrap();
            let fence = Fence::new(issuer, &lock, FencingToken(write.token)).unwrap();
            let yields = rng.random_range(0..4);
            let (barrier, round) = (barrier.clone(), round.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                for _ in 0..yields {
                    tokio::task::yield_now().await;
                }
                let outcome = writer.write(&fence, &write, &round).await;
                round.finished.fetch_add(1, Ordering::SeqCst);
                (writer, write, outcome)
            }));
        }
        let mut outcomes = Vec::new();
        for task in tasks {
            let (writer, write, outcome) = task.await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
            pool[write.writer] = Some(writer);
            outcomes.push((write, outcome));
        }

        let history = track.accepted(&lock, number).await;
        check_round(&context, &outcomes, &history, top, &mut tally);
        let last = history.last().unwrap();
        assert_eq!(
            track.current(&lock).await.as_ref(),
            Some(last),
            "{context}: the resource holds the last accepted write"
        );
        assert_eq!(
            track.fence_token(&lock).await,
            Some(top),
            "{context}: the fence holds the newest token"
        );
        held = top;
        tally.rounds += 1;
    }
    eprintln!("{issuer}: {tally:?} in {:?}", started.elapsed());
    assert!(
        tally.deposed_accepted > 0 && tally.deposed_refused > 0,
        "{issuer}, seed {seed}: the race never went both ways, so it tested nothing: {tally:?}"
    );
    tally
}

/// The properties of the module docs for one round's `outcomes` (what the
/// helper returned) and `history` (what the store recorded, in its order).
fn check_round(
    context: &str,
    outcomes: &[(Write, Result<(), FenceError>)],
    history: &[String],
    top: i64,
    tally: &mut Tally,
) {
    let by_tag: HashMap<String, Write> = outcomes.iter().map(|(w, _)| (w.tag(), *w)).collect();
    let mut seen = HashSet::new();
    let recorded: Vec<Write> = history
        .iter()
        .map(|tag| {
            assert!(seen.insert(tag), "{context}: {tag} recorded twice: {history:?}");
            *by_tag
                .get(tag)
                .unwrap_or_else(|| panic!("{context}: the store recorded {tag}, which no writer of the round wrote"))
        })
        .collect();
    for pair in recorded.windows(2) {
        assert!(
            pair[0].token <= pair[1].token,
            "{context}: the store accepted token {} after {}: {history:?}",
            pair[1].token,
            pair[0].token
        );
    }
    let accepted_tokens: HashSet<i64> = recorded.iter().map(|w| w.token).collect();
    for (write, outcome) in outcomes {
        tally.attempts += 1;
        let present = seen.contains(&write.tag());
        match outcome {
            Ok(()) => {
                assert!(
                    present,
                    "{context}: {write:?} was accepted but the store has no record of it: {history:?}"
                );
                tally.accepted += 1;
                if write.token < top {
                    tally.deposed_accepted += 1;
                }
            }
            Err(FenceError::Stale {
                offered, seen: higher, ..
            }) => {
                assert!(
                    !present,
                    "{context}: {write:?} was refused but the store recorded it: {history:?}"
                );
                assert_eq!(offered.0, write.token, "{context}: the refusal names the offered token");
                assert!(
                    higher.0 > write.token && accepted_tokens.contains(&higher.0),
                    "{context}: {write:?} was refused by {higher}, not a higher token accepted in the round: {history:?}"
                );
                tally.deposed_refused += 1;
            }
            Err(other) => panic!("{context}: {write:?} failed: {}", chain(other)),
        }
        if write.token == top {
            assert!(
                outcome.is_ok(),
                "{context}: the newest leader's {write:?} was refused: {outcome:?}"
            );
        }
    }
}

// --- PostgreSQL ---------------------------------------------------------------

struct PostgresTrack {
    url: String,
    monitor: Arc<tokio_postgres::Client>,
}

struct PostgresWriter {
    client: tokio_postgres::Client,
    index: usize,
    /// Every writer's backend.
    pids: Arc<Vec<i32>>,
    /// A connection outside the race, to watch the others wait.
    monitor: Arc<tokio_postgres::Client>,
}

async fn postgres_connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// Holds a fenced transaction (past the fence, so holding its row) until
/// every other writer of `round` waits on a lock; none may finish meanwhile.
async fn hold_until_the_others_wait(monitor: &tokio_postgres::Client, index: usize, pids: &[i32], round: &Round) {
    let others: Vec<i32> = round
        .writers
        .iter()
        .filter(|&&i| i != index)
        .map(|&i| pids[i])
        .collect();
    loop {
        assert_eq!(
            round.finished.load(Ordering::SeqCst),
            0,
            "round {}: a fenced write finished while writer {index}'s transaction held the fence row",
            round.number
        );
        let waiting: i64 = monitor
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1) AND wait_event_type = 'Lock'",
                &[&others],
            )
            .await
            .unwrap()
            .get(0);
        if waiting as usize == others.len() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[async_trait]
impl Writer for PostgresWriter {
    async fn write(&mut self, fence: &Fence, write: &Write, round: &Round) -> Result<(), FenceError> {
        let (tag, lock) = (write.tag(), fence.lock().to_string());
        let (index, pids, monitor) = (self.index, self.pids.clone(), self.monitor.clone());
        leasehold::fence::postgres::fenced(
            &mut self.client,
            leasehold::fence::postgres::DEFAULT_TABLE,
            fence,
            async |tx| {
                tx.execute(
                    "INSERT INTO race_history (lock_name, round, tag) VALUES ($1, $2, $3)",
                    &[&lock, &i64::from(write.round), &tag],
                )
                .await?;
                tx.execute(
                    "INSERT INTO race_current (lock_name, tag) VALUES ($1, $2) \
                     ON CONFLICT (lock_name) DO UPDATE SET tag = excluded.tag",
                    &[&lock, &tag],
                )
                .await?;
                if round.pileup && !round.holder.swap(true, Ordering::SeqCst) {
                    hold_until_the_others_wait(&monitor, index, &pids, round).await;
                }
                Ok(())
            },
        )
        .await
    }
}

#[async_trait]
impl Track for PostgresTrack {
    fn issuer(&self) -> &'static str {
        "postgres"
    }

    async fn writers(&mut self) -> Vec<Box<dyn Writer>> {
        let mut clients = Vec::new();
        for _ in 0..WRITERS {
            clients.push(postgres_connect(&self.url).await);
        }
        let mut pids = Vec::new();
        for client in &clients {
            pids.push(client.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0));
        }
        let pids = Arc::new(pids);
        clients
            .into_iter()
            .enumerate()
            .map(|(index, client)| {
                Box::new(PostgresWriter {
                    client,
                    index,
                    pids: pids.clone(),
                    monitor: self.monitor.clone(),
                }) as Box<dyn Writer>
            })
            .collect()
    }

    async fn accepted(&mut self, lock: &str, round: u32) -> Vec<String> {
        self.monitor
            .query(
                "SELECT tag FROM race_history WHERE lock_name = $1 AND round = $2 ORDER BY seq",
                &[&lock, &i64::from(round)],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    async fn current(&mut self, lock: &str) -> Option<String> {
        self.monitor
            .query_opt("SELECT tag FROM race_current WHERE lock_name = $1", &[&lock])
            .await
            .unwrap()
            .map(|row| row.get(0))
    }

    async fn fence_token(&mut self, lock: &str) -> Option<i64> {
        self.monitor
            .query_opt(
                "SELECT token FROM leasehold_fences WHERE issuer = 'postgres' AND lock_name = $1",
                &[&lock],
            )
            .await
            .unwrap()
            .map(|row| row.get(0))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_fenced_writers_race() {
    let server = PostgresServer::start();
    let monitor = postgres_connect(&server.url()).await;
    leasehold::fence::postgres::ensure_table(&monitor, leasehold::fence::postgres::DEFAULT_TABLE)
        .await
        .unwrap();
    monitor
        .batch_execute(
            "CREATE TABLE race_history (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
             lock_name TEXT NOT NULL, round BIGINT NOT NULL, tag TEXT NOT NULL UNIQUE); \
             CREATE TABLE race_current (lock_name TEXT PRIMARY KEY, tag TEXT NOT NULL)",
        )
        .await
        .unwrap();
    let mut track = PostgresTrack {
        url: server.url(),
        monitor: Arc::new(monitor),
    };
    race(&mut track, 200, true).await;
}

// --- Redis --------------------------------------------------------------------

/// The history: each write sets a key of its own; Redis publishes every
/// `SET` (keyspace notifications, `E$`) in the order it runs them, so the
/// order of those keys' events is the order the scripts ran.
struct RedisTrack {
    client: redis::Client,
    control: redis::aio::MultiplexedConnection,
    /// The keys Redis set, in its order.
    events: mpsc::UnboundedReceiver<String>,
}

struct RedisWriter(redis::aio::MultiplexedConnection);

fn redis_history_key(lock: &str, tag: &str) -> String {
    format!("race:{{{lock}}}:w:{tag}")
}

fn redis_current_key(lock: &str) -> String {
    format!("race:{{{lock}}}:current")
}

#[async_trait]
impl Writer for RedisWriter {
    async fn write(&mut self, fence: &Fence, write: &Write, _: &Round) -> Result<(), FenceError> {
        let tag = write.tag();
        let (history, current) = (redis_history_key(fence.lock(), &tag), redis_current_key(fence.lock()));
        leasehold::fence::redis::fenced(
            &mut self.0,
            fence,
            &[(&history, tag.as_bytes()), (&current, tag.as_bytes())],
        )
        .await
    }
}

impl RedisTrack {
    async fn start(server: &RedisServer) -> RedisTrack {
        let client = redis::Client::open(server.url()).unwrap();
        let mut control = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg("E$")
            .query_async(&mut control)
            .await
            .unwrap();
        let mut pubsub = client.get_async_pubsub().await.unwrap();
        pubsub.subscribe("__keyevent@0__:set").await.unwrap();
        let (sender, events) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                if sender.send(message.get_payload::<String>().unwrap()).is_err() {
                    return;
                }
            }
        });
        let mut track = RedisTrack {
            client,
            control,
            events,
        };
        track.until_mark("race:mark:subscribed").await;
        track
    }

    /// Sets `mark` and returns the keys set before it (every command sent
    /// before it has run, so its events came first).
    async fn until_mark(&mut self, mark: &str) -> Vec<String> {
        let _: () = redis::cmd("SET")
            .arg(mark)
            .arg(1)
            .query_async(&mut self.control)
            .await
            .unwrap();
        let mut keys = Vec::new();
        loop {
            let key = self.events.recv().await.expect("the keyspace events");
            if key == mark {
                return keys;
            }
            keys.push(key);
        }
    }
}

#[async_trait]
impl Track for RedisTrack {
    fn issuer(&self) -> &'static str {
        "redis"
    }

    async fn writers(&mut self) -> Vec<Box<dyn Writer>> {
        let mut writers: Vec<Box<dyn Writer>> = Vec::new();
        for _ in 0..WRITERS {
            // A connection each, so the scripts reach Redis at once.
            let connection = self.client.get_multiplexed_async_connection().await.unwrap();
            writers.push(Box::new(RedisWriter(connection)));
        }
        writers
    }

    async fn accepted(&mut self, lock: &str, round: u32) -> Vec<String> {
        let prefix = redis_history_key(lock, "");
        self.until_mark(&format!("race:mark:{round}"))
            .await
            .into_iter()
            .filter_map(|key| key.strip_prefix(&prefix).map(str::to_string))
            .collect()
    }

    async fn current(&mut self, lock: &str) -> Option<String> {
        redis::cmd("GET")
            .arg(redis_current_key(lock))
            .query_async(&mut self.control)
            .await
            .unwrap()
    }

    async fn fence_token(&mut self, lock: &str) -> Option<i64> {
        let fence = Fence::new("redis", lock, FencingToken(0)).unwrap();
        redis::cmd("GET")
            .arg(leasehold::fence::redis::fence_key(&fence))
            .query_async(&mut self.control)
            .await
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_fenced_writers_race() {
    let server = RedisServer::start();
    let mut track = RedisTrack::start(&server).await;
    race(&mut track, 1000, false).await;
}

/// Issue 56: the script compares tokens as decimal strings, length first,
/// so a longer token is the higher one ("999" < "1000", where a plain string
/// comparison says the opposite). Each pair on a fresh lock: the first
/// token written, then the second, accepted when it is not lower.
#[tokio::test]
async fn redis_orders_tokens_of_different_lengths_by_value() {
    let server = RedisServer::start();
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let pairs: [(i64, i64); 16] = [
        (999, 1000),
        (1000, 999),
        (9, 10),
        (10, 9),
        (0, 1),
        (1, 0),
        (99, 100),
        (100, 99),
        (99_999, 100_000),
        (100_000, 99_999),
        (1234, 1243),
        (1243, 1234),
        // Beyond Lua's exact doubles (2^53) and at the ends of i64.
        (9_007_199_254_740_993, 9_007_199_254_740_992),
        (999_999_999_999_999_999, 1_000_000_000_000_000_000),
        (1_000_000_000_000_000_000, 999_999_999_999_999_999),
        (i64::MAX - 1, i64::MAX),
    ];
    for (index, (first, second)) in pairs.into_iter().enumerate() {
        let lock = format!("lengths-{index}");
        let key = format!("orders:{{{lock}}}:owner");
        let fence = |token| Fence::new("redis", &lock, FencingToken(token)).unwrap();
        leasehold::fence::redis::fenced(&mut connection, &fence(first), &[(&key, b"first")])
            .await
            .unwrap_or_else(|e| panic!("{first} on a fresh lock: {e}"));
        let outcome = leasehold::fence::redis::fenced(&mut connection, &fence(second), &[(&key, b"second")]).await;
        let owner: String = redis::cmd("GET").arg(&key).query_async(&mut connection).await.unwrap();
        let held: i64 = redis::cmd("GET")
            .arg(leasehold::fence::redis::fence_key(&fence(0)))
            .query_async(&mut connection)
            .await
            .unwrap();
        if second >= first {
            assert!(
                outcome.is_ok(),
                "{second} after {first} was refused: {:?}",
                outcome.unwrap_err().to_string()
            );
            assert_eq!((owner.as_str(), held), ("second", second), "{second} after {first}");
        } else {
            match outcome {
                Err(FenceError::Stale { offered, seen, .. }) => {
                    assert_eq!((offered.0, seen.0), (second, first), "{second} after {first}")
                }
                other => panic!("{second} after {first} was not refused as stale: {other:?}"),
            }
            assert_eq!((owner.as_str(), held), ("first", first), "{second} after {first}");
        }
    }
}

// --- Spanner ------------------------------------------------------------------

/// The history: a row per write, stamped with its commit timestamp.
/// Transactions that both write the fence row commit at different
/// timestamps in the order they serialised.
struct SpannerTrack {
    spanner: google_cloud_spanner::client::Spanner,
    name: String,
    database: google_cloud_spanner::client::DatabaseClient,
}

struct SpannerWriter(google_cloud_spanner::client::DatabaseClient);

#[async_trait]
impl Writer for SpannerWriter {
    async fn write(&mut self, fence: &Fence, write: &Write, _: &Round) -> Result<(), FenceError> {
        use google_cloud_spanner::mutation::Mutation;
        let tag = write.tag();
        let history = Mutation::new_insert_builder("race_history")
            .set("tag")
            .to(tag.as_str())
            .set("lock_name")
            .to(fence.lock())
            .set("round")
            .to(i64::from(write.round))
            .set("committed_at")
            .to("spanner.commit_timestamp()")
            .build();
        let current = Mutation::new_insert_or_update_builder("race_current")
            .set("lock_name")
            .to(fence.lock())
            .set("tag")
            .to(tag.as_str())
            .build();
        leasehold::fence::spanner::fenced(
            &self.0,
            leasehold::fence::spanner::DEFAULT_TABLE,
            fence,
            vec![history, current],
        )
        .await
    }
}

impl SpannerTrack {
    async fn rows(&self, sql: &str, lock: &str, round: Option<u32>) -> Vec<google_cloud_spanner::result::Row> {
        let mut statement = google_cloud_spanner::statement::Statement::builder(sql).add_param("lock", lock);
        if let Some(round) = round {
            statement = statement.add_param("round", i64::from(round));
        }
        let mut rows = self
            .database
            .single_use()
            .build()
            .execute_query(statement.build())
            .await
            .unwrap();
        let mut all = Vec::new();
        while let Some(row) = rows.next().await {
            all.push(row.unwrap());
        }
        all
    }
}

#[async_trait]
impl Track for SpannerTrack {
    fn issuer(&self) -> &'static str {
        "spanner"
    }

    async fn writers(&mut self) -> Vec<Box<dyn Writer>> {
        let mut writers: Vec<Box<dyn Writer>> = Vec::new();
        for _ in 0..WRITERS {
            // A client (a session) each, as each leader has its own.
            let database = self.spanner.database_client(self.name.clone()).build().await.unwrap();
            writers.push(Box::new(SpannerWriter(database)));
        }
        writers
    }

    async fn accepted(&mut self, lock: &str, round: u32) -> Vec<String> {
        let rows = self
            .rows(
                "SELECT tag, CAST(committed_at AS STRING) AS committed FROM race_history \
                 WHERE lock_name = @lock AND round = @round ORDER BY committed_at",
                lock,
                Some(round),
            )
            .await;
        let mut tags = Vec::new();
        let mut last: Option<String> = None;
        for row in rows {
            let (tag, at): (String, String) = (row.get("tag").unwrap(), row.get("committed").unwrap());
            assert_ne!(
                last.as_ref(),
                Some(&at),
                "two fenced writes to {lock} committed at {at}: no order"
            );
            last = Some(at);
            tags.push(tag);
        }
        tags
    }

    async fn current(&mut self, lock: &str) -> Option<String> {
        let rows = self
            .rows("SELECT tag FROM race_current WHERE lock_name = @lock", lock, None)
            .await;
        rows.first().map(|row| row.get("tag").unwrap())
    }

    async fn fence_token(&mut self, lock: &str) -> Option<i64> {
        let rows = self
            .rows(
                "SELECT token FROM leasehold_fences WHERE issuer = 'spanner' AND lock_name = @lock",
                lock,
                None,
            )
            .await;
        rows.first().map(|row| row.get("token").unwrap())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spanner_fenced_writers_race() {
    let emulator = Emulator::start_or_connect();
    let config = emulator.create_database(leasehold::store::DEFAULT_TABLE).await;
    for statement in [
        leasehold::fence::spanner::create_table_statement(leasehold::fence::spanner::DEFAULT_TABLE).unwrap(),
        "CREATE TABLE race_history (tag STRING(MAX) NOT NULL, lock_name STRING(MAX) NOT NULL, round INT64 NOT NULL, \
         committed_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true)) PRIMARY KEY (tag)"
            .to_string(),
        "CREATE TABLE race_current (lock_name STRING(MAX) NOT NULL, tag STRING(MAX) NOT NULL) PRIMARY KEY (lock_name)"
            .to_string(),
    ] {
        emulator.ddl(&config.database, &statement).await;
    }
    let spanner = emulator.client().await;
    let database = spanner.database_client(config.database.clone()).build().await.unwrap();
    let name = config.database.clone();
    race(
        &mut SpannerTrack {
            spanner,
            name,
            database,
        },
        60,
        false,
    )
    .await;
}
