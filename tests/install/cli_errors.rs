//! The errors a newcomer meets first, as the binary prints them: a short
//! line for the problem and what to do, a line per cause, each said once.

use std::process::{Command, Output};

/// `leasehold ARGS` with no usable kubeconfig: KUBECONFIG as given (or
/// unset), an empty HOME (no ~/.kube/config) and outside a pod.
fn without_cluster(kubeconfig: Option<&str>, args: &[&str]) -> Output {
    let home = std::env::temp_dir().join(format!("leasehold-empty-home-{:08x}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command
        .args(args)
        .env("HOME", &home)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT");
    if let Some(path) = kubeconfig {
        command.env("KUBECONFIG", path);
    }
    command.output().expect("leasehold runs")
}

/// stderr: `error: …` then `  cause: …` lines, each short, none saying
/// again what another line says (no `: `-separated part of one line is in
/// another). Returns the lines.
fn error_lines(output: &Output) -> Vec<String> {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "expected a failure: {output:?}");
    let lines: Vec<String> = stderr.lines().map(str::to_string).collect();
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(lines[1..].iter().all(|l| l.starts_with("  cause: ")), "{stderr}");
    for line in &lines {
        assert!(line.chars().count() <= 200, "a long line: {line}");
    }
    let parts = |line: &str| -> Vec<String> {
        let text = line.split_once(": ").map_or(line, |(_, text)| text);
        text.split(": ").filter(|p| p.len() >= 12).map(str::to_string).collect()
    };
    for (i, a) in lines.iter().enumerate() {
        for b in &lines[i + 1..] {
            for part in parts(a) {
                assert!(!b.contains(&part), "{part:?} said again:\n{stderr}");
            }
            for part in parts(b) {
                assert!(!a.contains(&part), "{part:?} said again:\n{stderr}");
            }
        }
    }
    lines
}

#[test]
fn a_missing_kubeconfig_names_it_and_the_flag_once() {
    let missing = "/nonexistent/leasehold/kubeconfig";
    for command in [&["status"][..], &["check"][..]] {
        let lines = error_lines(&without_cluster(Some(missing), command));
        assert_eq!(
            lines[0],
            format!(
                "error: cannot read the kubeconfig {missing}: pass --kubeconfig <file> or set KUBECONFIG to a \
                 readable kubeconfig"
            ),
            "{command:?}"
        );
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(lines[1].contains("No such file or directory"), "{lines:#?}");
    }
}

/// A kubeconfig that exists but is not one: the same advice, and the cause
/// says what is wrong with it (not that it is missing).
#[test]
fn a_kubeconfig_that_does_not_parse_says_so() {
    let dir = std::env::temp_dir().join(format!("leasehold-bad-kubeconfig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("kubeconfig");
    std::fs::write(&bad, "clusters: [this is: not a kubeconfig\n").unwrap();
    let bad = bad.to_str().unwrap();
    let output = without_cluster(Some(bad), &["status"]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!output.status.success());
    // The YAML parser's cause shows the offending line under it, so the
    // cause spans lines here (error_lines expects one line per cause).
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "error: cannot read the kubeconfig {bad}: pass --kubeconfig <file> or set KUBECONFIG to a readable kubeconfig"
        )
    );
    assert!(
        lines[1].starts_with("  cause: failed to parse kubeconfig YAML"),
        "{stderr}"
    );
    assert!(!stderr.contains("No such file"), "{stderr}");
}

#[test]
fn no_kubeconfig_at_all_says_where_it_looked_and_what_to_do() {
    let lines = error_lines(&without_cluster(None, &["status", "-n", "shop"]));
    assert!(
        lines[0].starts_with(
            "error: no kubeconfig: KUBECONFIG is unset, ~/.kube/config cannot be read and this is not a pod; \
             pass --kubeconfig <file> or set KUBECONFIG"
        ),
        "{lines:#?}"
    );
}

/// A context the kubeconfig lacks is named with the ones it has (kube's
/// own error said only "failed to load current context").
#[test]
fn an_unknown_context_is_named_with_the_known_ones() {
    let kubeconfig = std::env::temp_dir().join(format!("leasehold-contexts-{:08x}.yaml", rand::random::<u32>()));
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n\
         users:\n- name: u\n  user: {}\ncontexts:\n- name: kind-a\n  context: {cluster: c, user: u}\n\
         - name: kind-b\n  context: {cluster: c, user: u}\ncurrent-context: kind-a\n",
    )
    .unwrap();
    for command in [
        &["status", "--context", "nope"][..],
        &["check", "--context", "nope"][..],
    ] {
        let lines = error_lines(&without_cluster(kubeconfig.to_str(), command));
        assert_eq!(
            lines,
            ["error: the kubeconfig has no context \"nope\" (it has: kind-a, kind-b); pass --context with one of them"],
            "{command:?}"
        );
    }
    let _ = std::fs::remove_file(&kubeconfig);
}

/// `leasehold version` without a cluster still prints the client's version,
/// and says why the operator's is unknown.
#[test]
fn version_without_a_cluster_says_why_the_operators_is_unknown() {
    let output = without_cluster(Some("/nonexistent/kubeconfig"), &["version"]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.starts_with(&format!(
            "client: {}\noperator: unknown (cannot read the cluster: cannot read the kubeconfig /nonexistent/kubeconfig",
            env!("CARGO_PKG_VERSION")
        )),
        "{stdout}"
    );
}

/// Completion scripts for the shells clap_complete knows, each naming the
/// commands and their flags.
#[test]
fn completions_cover_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let output = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["completions", shell])
            .output()
            .expect("leasehold runs");
        assert!(output.status.success(), "{shell}: {output:?}");
        let script = String::from_utf8_lossy(&output.stdout);
        for word in ["leasehold", "status", "check", "version", "kubeconfig", "version-name"] {
            assert!(script.contains(word), "{shell}: no {word:?} in the script");
        }
    }
}

/// A store nobody listens on: the address and how long was waited.
#[test]
fn an_unreachable_store_names_its_address_and_the_timeout() {
    // Port 1 (tcpmux) is closed on any test machine: the connection is refused at once.
    for (store, url, says) in [
        (
            "postgres",
            "postgres://leasehold@127.0.0.1:1/leases",
            "no connection to PostgreSQL at 127.0.0.1:1 within ",
        ),
        (
            "redis",
            "redis://127.0.0.1:1/0",
            "no connection to Redis at 127.0.0.1:1 within ",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["advise", "--store", store, "--store-url", url, "--for", "1s"])
            .env_remove("LEASEHOLD_STORE_URL_FILE")
            .output()
            .expect("leasehold runs");
        let lines = error_lines(&output);
        assert!(lines.iter().any(|l| l.contains(says)), "{store}: {lines:#?}");
    }
}

/// An API server that does not answer is named, with what to check; the
/// cause (connection refused) follows once.
#[test]
fn an_api_server_that_does_not_answer_is_named() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = format!("https://{}", closed.local_addr().unwrap());
    drop(closed);
    let dir = std::env::temp_dir().join(format!("leasehold-down-kubeconfig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: down\n\
             clusters: [{{name: down, cluster: {{server: \"{server}\", insecure-skip-tls-verify: true}}}}]\n\
             users: [{{name: me, user: {{token: t}}}}]\n\
             contexts: [{{name: down, context: {{cluster: down, user: me}}}}]\n"
        ),
    )
    .unwrap();
    let output = without_cluster(Some(path.to_str().unwrap()), &["status"]);
    std::fs::remove_dir_all(&dir).unwrap();
    let lines = error_lines(&output);
    assert!(
        lines[0].starts_with(&format!("error: no answer from the API server at {server}/")),
        "{lines:#?}"
    );
    assert!(lines.iter().any(|l| l.contains("onnection refused")), "{lines:#?}");
}
