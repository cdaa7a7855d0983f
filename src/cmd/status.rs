//! `leasehold status` (and, through a `kubectl-leasehold` link on PATH,
//! `kubectl leasehold status`): one line per DistributedLease with who
//! holds it, the cluster it runs in, its term, how old the current token is, how long leadership has
//! been as it is, the candidates ready / total, the version policy and the
//! conditions, from the status the operator keeps. `-o json` prints the same
//! as JSON; `--watch` then follows the leases (kube-runtime's watcher) and
//! prints a lease again each time any of that changes (ages aside).
//! `--history LEASE` prints the lease's last terms (`status.history`).

use std::collections::BTreeMap;

use futures::TryStreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde::Serialize;

use super::{ClusterArgs, Output};
use crate::api::DistributedLease;
use crate::api::history::HistoryEntry;
use crate::lease::Prefer;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Show the DistributedLeases of this namespace only (default: all namespaces).
    #[arg(short, long, env = "LEASEHOLD_STATUS_NAMESPACE")]
    pub namespace: Option<String>,
    /// Output format: a table, JSON (an array; with --watch one object per
    /// line) or YAML (a list; with --watch one document per lease).
    #[arg(short, long, env = "LEASEHOLD_STATUS_OUTPUT", value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// After the current state, print each lease again whenever its holder,
    /// term, candidates, version policy or conditions change, until interrupted.
    #[arg(short, long, env = "LEASEHOLD_STATUS_WATCH")]
    pub watch: bool,
    /// Print the last terms of this DistributedLease instead (its
    /// `status.history`, oldest first), in the namespace given or the
    /// kubeconfig's.
    #[arg(
        long,
        env = "LEASEHOLD_STATUS_HISTORY",
        value_name = "LEASE",
        conflicts_with = "watch"
    )]
    pub history: Option<String>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error(transparent)]
    Client(#[from] crate::api::client::ClientError),
    #[error("cannot list DistributedLeases")]
    List(#[source] kube::Error),
    /// The API server did not answer: which one, and what to check.
    #[error(
        "no answer from the API server at {server}: is the cluster up, and are the kubeconfig and \
         --context the ones you meant?"
    )]
    Unreachable {
        server: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot read DistributedLease {0}")]
    Get(String, #[source] kube::Error),
    #[error("watching DistributedLeases failed")]
    Watch(#[source] watcher::Error),
    #[error("cannot write the output")]
    Write(#[source] std::io::Error),
}

/// A condition as the status line shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ConditionState {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
}

/// A partitioned lease's assignment, in brief.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct PartitionsSummary {
    pub count: u32,
    pub members: u32,
    pub unowned: u32,
}

/// One DistributedLease's line.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LeaseStatus {
    pub namespace: String,
    pub name: String,
    /// The identity holding a valid lease; `None` when free or expired.
    pub holder: Option<String>,
    /// The cluster the holder runs in, from its identity (`None` when the
    /// holder names none); with several clusters on one lock, where the
    /// leader is.
    pub holder_cluster: Option<String>,
    pub term: Option<u64>,
    pub token: Option<String>,
    /// Seconds since the current (or last) term's token: its acquisition's
    /// commit time on the store's clock.
    pub token_age_seconds: Option<f64>,
    /// Seconds since leadership last changed: the later of the token's
    /// acquisition and the `Ready` condition's last transition (the lock
    /// gaining or losing its leader).
    pub since_transition_seconds: Option<f64>,
    pub ready_candidates: u32,
    pub candidates: u32,
    pub prefer: Prefer,
    pub version_fence: bool,
    pub conditions: Vec<ConditionState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partitions: Option<PartitionsSummary>,
    /// With --watch: the lease was deleted.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
}

impl LeaseStatus {
    /// The line of `lease` as of `now`.
    pub(crate) fn of(lease: &DistributedLease, now: Timestamp) -> LeaseStatus {
        let status = lease.status.clone().unwrap_or_default();
        let acquired = status
            .token
            .as_deref()
            .and_then(|t| t.parse::<i128>().ok())
            .and_then(|nanos| Timestamp::from_nanosecond(nanos).ok());
        let ready_since = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.last_transition_time.0);
        let age = |at: Timestamp| now.duration_since(at).as_secs_f64().max(0.0);
        LeaseStatus {
            namespace: lease.namespace().unwrap_or_default(),
            name: lease.name_any(),
            holder: status.holder,
            holder_cluster: status.holder_cluster,
            term: status.term,
            token: status.token,
            token_age_seconds: acquired.map(age),
            since_transition_seconds: acquired.into_iter().chain(ready_since).max().map(age),
            ready_candidates: status.ready_candidates,
            candidates: status.candidates,
            prefer: lease.spec.leadership.prefer,
            version_fence: lease.spec.leadership.version_fence,
            conditions: status
                .conditions
                .iter()
                .map(|c| ConditionState {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                })
                .collect(),
            partitions: status.partitions.map(|p| PartitionsSummary {
                count: p.count,
                members: p.members,
                unowned: p.unowned,
            }),
            deleted: false,
        }
    }

    /// What `--watch` compares: everything but the ages, which move on
    /// their own.
    fn state(&self) -> LeaseStatus {
        LeaseStatus {
            token_age_seconds: None,
            since_transition_seconds: None,
            ..self.clone()
        }
    }

    fn cells(&self) -> [String; 10] {
        let holder = match (&self.partitions, &self.holder) {
            (Some(p), _) => format!("<{} partitions, {} members, {} unowned>", p.count, p.members, p.unowned),
            (None, Some(holder)) => holder.clone(),
            (None, None) => "<none>".into(),
        };
        let conditions = match self.deleted {
            true => "<deleted>".to_string(),
            false => self
                .conditions
                .iter()
                .map(|c| format!("{}={}", c.type_, c.status))
                .collect::<Vec<_>>()
                .join(","),
        };
        let versions = match self.version_fence {
            true => format!("{:?}+fence", self.prefer),
            false => format!("{:?}", self.prefer),
        };
        [
            self.namespace.clone(),
            self.name.clone(),
            holder,
            self.holder_cluster.clone().unwrap_or_else(|| "-".into()),
            self.term.map_or("-".into(), |t| t.to_string()),
            age(self.token_age_seconds),
            age(self.since_transition_seconds),
            format!("{}/{}", self.ready_candidates, self.candidates),
            versions,
            conditions,
        ]
    }
}

const HEADER: [&str; 10] = [
    "NAMESPACE",
    "NAME",
    "HOLDER",
    "CLUSTER",
    "TERM",
    "TOKEN AGE",
    "SINCE CHANGE",
    "READY",
    "VERSIONS",
    "CONDITIONS",
];

/// A duration as kubectl shows ages: 45s, 3m12s, 2h5m, 4d3h; `-` unknown.
fn age(seconds: Option<f64>) -> String {
    let Some(seconds) = seconds else { return "-".into() };
    let s = seconds as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

/// The table: a header and one aligned line per lease.
pub(crate) fn table(leases: &[LeaseStatus]) -> String {
    aligned(HEADER, leases.iter().map(LeaseStatus::cells))
}

const HISTORY_HEADER: [&str; 6] = ["TERM", "HOLDER", "TOKEN", "ACQUIRED AT", "ENDED AT", "ENDED"];

/// `--history`: one aligned line per term or gap, oldest first.
pub(crate) fn history_table(history: &[HistoryEntry]) -> String {
    let cell = |value: &Option<String>| value.clone().unwrap_or_else(|| "-".into());
    let rows = history.iter().map(|entry| match entry.missing_through {
        Some(last) => [
            format!("{}-{last}", entry.term),
            "<not seen: the operator read none of these terms>".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
        ],
        None => [
            entry.term.to_string(),
            cell(&entry.holder),
            cell(&entry.token),
            cell(&entry.acquired_at),
            cell(&entry.ended_at),
            entry.ended.map_or("-".into(), |e| format!("{e:?}")),
        ],
    });
    aligned(HISTORY_HEADER, rows)
}

fn aligned<const N: usize>(header: [&str; N], lines: impl Iterator<Item = [String; N]>) -> String {
    let rows: Vec<[String; N]> = std::iter::once(header.map(String::from)).chain(lines).collect();
    let widths: Vec<usize> = (0..N)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:w$}")).collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// The leases' lines, ordered by namespace and name.
pub(crate) async fn list(api: &Api<DistributedLease>) -> Result<Vec<LeaseStatus>, Error> {
    let now = Timestamp::now();
    let mut lines: Vec<LeaseStatus> = api
        .list(&Default::default())
        .await
        .map_err(Error::List)?
        .iter()
        .map(|lease| LeaseStatus::of(lease, now))
        .collect();
    lines.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(lines)
}

/// Follows the leases and hands `emit` each lease whose state differs from
/// what it last emitted for it (each lease once at the start), and each
/// deletion. Ends only on `emit`'s error; the watcher retries with backoff.
pub(crate) async fn watch(
    api: Api<DistributedLease>,
    mut emit: impl FnMut(&LeaseStatus) -> std::io::Result<()>,
) -> Result<(), Error> {
    let mut shown: BTreeMap<(String, String), LeaseStatus> = BTreeMap::new();
    let events = watcher(api, watcher::Config::default()).default_backoff();
    let mut events = std::pin::pin!(events.map_err(Error::Watch));
    while let Some(event) = events.try_next().await? {
        let (lease, deleted) = match event {
            watcher::Event::InitApply(lease) | watcher::Event::Apply(lease) => (lease, false),
            watcher::Event::Delete(lease) => (lease, true),
            watcher::Event::Init | watcher::Event::InitDone => continue,
        };
        let line = LeaseStatus {
            deleted,
            ..LeaseStatus::of(&lease, Timestamp::now())
        };
        let key = (line.namespace.clone(), line.name.clone());
        let state = line.state();
        if deleted {
            shown.remove(&key);
        } else if shown.get(&key) == Some(&state) {
            continue;
        } else {
            shown.insert(key, state);
        }
        emit(&line).map_err(Error::Write)?;
    }
    Ok(())
}

/// `--history LEASE`: the lease's `status.history` in `output`'s form
/// (JSON and YAML: the list of entries, as the status holds them).
pub(crate) async fn history(api: &Api<DistributedLease>, name: &str, output: Output) -> Result<String, Error> {
    let lease = api.get(name).await.map_err(|e| Error::Get(name.to_string(), e))?;
    let history = lease.status.unwrap_or_default().history;
    Ok(match output {
        Output::Table => history_table(&history),
        Output::Json => serde_json::to_string_pretty(&history).expect("history serializes") + "\n",
        Output::Yaml => serde_yaml::to_string(&history).expect("history serializes"),
    })
}

fn json_line(line: &LeaseStatus) -> String {
    serde_json::to_string(line).expect("a status line serializes")
}

/// `leasehold status`.
pub(crate) async fn run(args: Args) -> Result<(), Error> {
    use std::io::Write;
    let (client, server) = args.cluster.connect().await?;
    // A failure to reach the server names it; an answer that refuses
    // (403, 404) is the server's own message.
    let unreachable = |e: Error| match e {
        Error::List(source @ (kube::Error::HyperError(_) | kube::Error::Service(_)))
        | Error::Get(_, source @ (kube::Error::HyperError(_) | kube::Error::Service(_))) => Error::Unreachable {
            server: server.clone(),
            source,
        },
        other => other,
    };
    let api: Api<DistributedLease> = match (&args.namespace, &args.history) {
        (Some(namespace), _) => Api::namespaced(client, namespace),
        (None, Some(_)) => Api::default_namespaced(client),
        (None, None) => Api::all(client),
    };
    let mut stdout = std::io::stdout().lock();
    if let Some(name) = &args.history {
        let text = history(&api, name, args.output).await.map_err(unreachable)?;
        return stdout.write_all(text.as_bytes()).map_err(Error::Write);
    }
    if !args.watch {
        let lines = list(&api).await.map_err(unreachable)?;
        let text = match args.output {
            Output::Table => table(&lines),
            Output::Json => serde_json::to_string_pretty(&lines).expect("status lines serialize") + "\n",
            Output::Yaml => serde_yaml::to_string(&lines).expect("status lines serialize"),
        };
        return stdout.write_all(text.as_bytes()).map_err(Error::Write);
    }
    // Lines come one at a time, so no width is known ahead: with --watch the
    // table's columns are separated by tabs.
    if args.output == Output::Table {
        writeln!(stdout, "{}", HEADER.join("\t")).map_err(Error::Write)?;
    }
    watch(api, |line| {
        let text = match args.output {
            Output::Table => line.cells().join("\t"),
            Output::Json => json_line(line),
            Output::Yaml => format!(
                "---\n{}",
                serde_yaml::to_string(line)
                    .expect("a status line serializes")
                    .trim_end()
            ),
        };
        writeln!(stdout, "{text}")?;
        stdout.flush()
    })
    .await
}

#[cfg(test)]
mod tests;
