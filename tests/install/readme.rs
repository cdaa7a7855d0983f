//! The README's commands work as written: the walkthrough's `sh e2e` blocks
//! are there, in the order the install needs, use only what the end-to-end
//! suite provides and agree with the example manifests and the chart; the
//! one-machine trial (`sh local`) runs here against a private PostgreSQL.

use crate::support::readme as readme_blocks;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use leasehold::sidecar::Listening;
use leasehold::testing::servers::{PostgresServer, scratch_dir};
use readme_blocks::{blocks, e2e_script, unprovided};

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

#[test]
fn the_walkthrough_steps_come_in_the_order_the_install_needs() {
    let script = e2e_script(&read("README.md"));
    // The namespace before the chart puts the sidecar's Role in it; the
    // operator (and its webhook's certificate) before the namespace's pods;
    // the chart's Roles checked before the lease on Leases; the lease
    // before its pods.
    let steps = [
        "kubectl create namespace my-app",
        "kubectl label namespace my-app leasehold.dev/inject=enabled",
        "helm install leasehold charts/leasehold",
        "mutatingwebhookconfiguration/leasehold-sidecar-injector",
        "auth can-i update leases.coordination.k8s.io --as system:serviceaccount:my-app:scheduler",
        "auth can-i get leases.coordination.k8s.io --as system:serviceaccount:leasehold-system:leasehold",
        "-f manifests/examples/lease.yaml",
        "-f manifests/examples/leader-only-service.yaml",
        "--for=condition=Ready distributedlease/scheduler",
        // The gate is added when a pod is created: the old pods go first.
        "delete -f manifests/examples/leader-only-service.yaml",
        "-f manifests/examples/readiness-gated.yaml",
        "--for=jsonpath='{.status.readyReplicas}'=1 deployment/scheduler",
    ];
    let mut at = 0;
    for step in steps {
        let found = script[at..]
            .find(step)
            .unwrap_or_else(|| panic!("{step:?} missing or out of order in:\n{script}"));
        at += found + step.len();
    }
}

#[test]
fn the_walkthrough_uses_only_what_the_end_to_end_suite_provides() {
    let readme = read("README.md");
    let script = e2e_script(&readme);
    assert_eq!(unprovided(&script), Vec::<String>::new());
    assert!(blocks(&readme, "sh e2e").len() >= 5, "{script}");
    // Every file it applies exists.
    for word in script.split_whitespace().filter(|w| w.starts_with("manifests/")) {
        assert!(Path::new(env!("CARGO_MANIFEST_DIR")).join(word).is_file(), "{word}");
    }
    // The check catches what the suite cannot run.
    let planted = "docker build -t leasehold:dev .\nkubectl get pods | grep x\necho $HOME\n";
    assert_eq!(
        unprovided(planted),
        [
            "command \"docker\" (docker build -t leasehold:dev .)",
            "command \"grep\" (grep x)",
            "command \"echo\" (echo $HOME)",
            "variable $HOME"
        ]
    );
}

/// The chart binds the sidecar Role to the ServiceAccount and namespace the
/// walkthrough's pods use: the `--set` of the install names exactly what the
/// example Deployments run as.
#[test]
fn the_walkthrough_binds_the_account_the_examples_run_as() {
    let script = e2e_script(&read("README.md"));
    let set = script
        .split("'sidecar.rbac.namespaces.")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .expect("the install sets sidecar.rbac.namespaces");
    let (namespace, accounts) = set.split_once('=').unwrap();
    assert!(
        script.contains(&format!("kubectl create namespace {namespace}")),
        "{script}"
    );
    for example in ["leader-only-service", "readiness-gated"] {
        let text = read(&format!("manifests/examples/{example}.yaml"));
        let account = text
            .split("serviceAccountName: ")
            .nth(1)
            .unwrap()
            .lines()
            .next()
            .unwrap();
        assert_eq!(accounts, format!("{{{account}}}"), "{example} runs as {account}");
        // kubectl -n refuses a file naming another namespace.
        for object in text.split("\n---\n") {
            assert!(
                format!("{object}\n").contains(&format!("\n  namespace: {namespace}\n")),
                "{example}: {object}"
            );
        }
        assert!(script.contains(&format!(
            "kubectl -n {namespace} apply -f manifests/examples/{example}.yaml"
        )));
    }
}

fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let status = answer.split(' ').nth(1)?.parse().ok()?;
    Some((status, answer.split("\r\n\r\n").nth(1).unwrap_or_default().to_string()))
}

/// The one-machine trial, run as written (the `sh local` block) with
/// `leasehold` on PATH and LEASEHOLD_STORE_URL pointing at a fresh
/// PostgreSQL: the two candidates start on their own ports, the table gets
/// created, and one leads while the other follows.
///
/// The README's fixed ports (4040/4041 by default, 4050/4051 for the
/// second) could be taken by anything else on the machine, so the block
/// runs with every listener on port 0 (`LEASEHOLD_HTTP_ADDR` and
/// `LEASEHOLD_METRICS_ADDR` for the first, the second's flags rewritten),
/// each candidate writing the ports it got to a `--ready-file`, and its
/// `curl`s reading them from there. Each rewrite must apply exactly once,
/// so a changed block fails here instead of running unrewritten.
#[test]
fn the_one_machine_trial_elects_one_of_two_candidates() {
    let trial = blocks(&read("README.md"), "sh local");
    let [trial] = trial.as_slice() else {
        panic!("one `sh local` block expected, found {}", trial.len())
    };
    let dir = scratch_dir("readme-trial");
    let ready = |pod: &str| dir.join(format!("{pod}.json"));
    let http_of = |pod: &str| {
        format!(
            r#"$(sed -n 's/.*"http": *"\([^"]*\)".*/\1/p' {})"#,
            ready(pod).display()
        )
    };
    let mut script = trial.text.clone();
    for (written, run) in [
        (
            "--pod-name a",
            format!("--pod-name a --ready-file {}", ready("a").display()),
        ),
        (
            "--pod-name b",
            format!("--pod-name b --ready-file {}", ready("b").display()),
        ),
        ("--http-addr 127.0.0.1:4050", "--http-addr 127.0.0.1:0".into()),
        ("--metrics-addr 127.0.0.1:4051", "--metrics-addr 127.0.0.1:0".into()),
        ("curl -s 127.0.0.1:4040/", format!("curl -s {}/", http_of("a"))),
        ("curl -s 127.0.0.1:4050/", format!("curl -s {}/", http_of("b"))),
    ] {
        assert_eq!(
            script.matches(written).count(),
            1,
            "the README's `sh local` block no longer has {written:?} once:\n{}",
            trial.text
        );
        script = script.replace(written, &run);
    }
    let postgres = PostgresServer::start();
    let binary = Path::new(env!("CARGO_BIN_EXE_leasehold"));
    let path = format!(
        "{}:{}",
        binary.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut shell = Command::new("bash")
        .args(["-c", &script])
        .env("PATH", path)
        .env("LEASEHOLD_STORE_URL", postgres.url())
        // The first candidate's listeners, which the block leaves at their defaults.
        .env("LEASEHOLD_HTTP_ADDR", "127.0.0.1:0")
        .env("LEASEHOLD_METRICS_ADDR", "127.0.0.1:0")
        .stdout(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let group = shell.id();
    let stop = || {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{group}")])
            .status();
    };
    // The script ends after its curls; the candidates it started run on.
    let finished = shell.wait().unwrap();
    let started = std::time::Instant::now();
    let ports = ["a", "b"].map(|pod| {
        loop {
            if let Ok(text) = std::fs::read_to_string(ready(pod)) {
                let listening: Listening =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", ready(pod).display()));
                break listening.http.port();
            }
            if started.elapsed() > Duration::from_secs(60) {
                stop();
                panic!(
                    "candidate {pod} wrote no ready file {} within a minute",
                    ready(pod).display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut outcome = None;
    for _ in 0..600 {
        match (get(ports[0], "/leader"), get(ports[1], "/leader")) {
            (Some((a, a_body)), Some((b, b_body))) if a != b && [a, b].contains(&200) && [a, b].contains(&503) => {
                outcome = Some((a_body, b_body));
                break;
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    stop();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(finished.success(), "the trial's commands failed: {finished}");
    let (a, b) = outcome.expect("no leader and follower on the candidates' ports within a minute");
    let leaders = [a, b].iter().filter(|body| body.contains("\"leader\":true")).count();
    assert_eq!(leaders, 1);
}
