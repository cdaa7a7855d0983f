//! The install files agree with the code: RBAC grants exactly what the code
//! calls, the chart ships the generated CRD, and the manifests validate
//! against the Kubernetes schemas (scripts/check-manifests.py).

use std::path::Path;
use std::process::Command;

use leasehold::operator::election::DEFAULT_LEASE_NAME;
use leasehold::operator::rbac::{NAMESPACED_RULES, RULES, STORE_RULES, WEBHOOK_CONFIGURATION};
use leasehold::rbac::rules_yaml;

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn rbac_in_the_chart_and_manifests_is_exactly_what_the_code_calls() {
    let operator = rules_yaml(RULES);
    let operator_namespaced = rules_yaml(NAMESPACED_RULES);
    let operator_stores = rules_yaml(STORE_RULES);
    let sidecar = rules_yaml(leasehold::sidecar::rbac::RULES);
    let transfer = rules_yaml(leasehold::cmd::transfer::RULES);
    for (file, expected) in [
        (
            "manifests/install.yaml",
            vec![&operator, &operator_namespaced, &transfer],
        ),
        ("charts/leasehold/templates/rbac-transfer.yaml", vec![&transfer]),
        (
            "charts/leasehold/templates/rbac-operator.yaml",
            vec![&operator, &operator_namespaced, &operator_stores],
        ),
        ("charts/leasehold/templates/rbac-sidecar.yaml", vec![&sidecar]),
    ] {
        let text = as_release_leasehold(&read(file));
        for rules in expected {
            assert!(text.contains(rules.as_str()), "{file} must grant exactly:\n{rules}");
        }
        // No other rules block sneaks in more.
        let blocks = text.matches("\nrules:\n").count();
        assert_eq!(
            blocks,
            text.matches("\nkind: Role\n").count() + text.matches("\nkind: ClusterRole\n").count(),
            "{file}"
        );
    }
}

/// The sidecar's Role has one owner, the chart (bound to the ServiceAccounts
/// `sidecar.rbac.namespaces` names): the examples bring none of their own,
/// which would collide with the chart's by name and bind other accounts.
#[test]
fn the_examples_leave_the_sidecar_role_to_the_chart() {
    for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/examples")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for kind in ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"] {
            assert!(
                !text.contains(&format!("\nkind: {kind}\n")),
                "{}: a {kind}",
                path.display()
            );
        }
    }
}

/// The chart names release-scoped objects after the release; the rules name
/// them as a release called `leasehold` does.
fn as_release_leasehold(template: &str) -> String {
    template.replace("{{ include \"leasehold.fullname\" . }}", "leasehold")
}

/// The objects the operator's RBAC is limited to by name are the ones the
/// shipped operator is told to use.
#[test]
fn the_operator_uses_the_objects_its_rbac_names() {
    for file in ["charts/leasehold/templates/deployment.yaml", "manifests/install.yaml"] {
        let text = as_release_leasehold(&read(file));
        for (env, name) in [
            ("LEASEHOLD_ELECTION_LEASE_NAME", DEFAULT_LEASE_NAME),
            ("LEASEHOLD_WEBHOOK_CONFIGURATION", WEBHOOK_CONFIGURATION),
        ] {
            let setting = format!("- name: {env}\n              value: {name}\n");
            assert!(text.contains(&setting), "{file} must set {env} to {name}");
        }
    }
}

#[test]
fn the_chart_ships_the_generated_crds() {
    for (file, _) in leasehold::api::crds() {
        assert_eq!(
            read(&format!("charts/leasehold/crds/{file}")),
            read(&format!("crds/{file}")),
            "copy crds/{file} into charts/leasehold/crds/"
        );
        assert!(
            read("manifests/install.yaml").contains(read(&format!("crds/{file}")).trim_end()),
            "install.yaml carries crds/{file}"
        );
    }
}

#[test]
fn manifests_validate_against_the_kubernetes_schemas() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = std::env::var("LEASEHOLD_VENV")
        .map(|v| root.join(v))
        .unwrap_or_else(|_| root.join(".venv"));
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-python.sh (it installs kubernetes-validate, jsonschema, helm-python-sdk and cel-python)",
        python.display()
    );
    // What `leasehold inject` makes of the examples is checked like the
    // manifests: strict schemas, the non-root rule, native sidecars.
    let examples: Vec<_> = std::fs::read_dir(root.join("manifests/examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    let injected = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .arg("inject")
        .args(&examples)
        .output()
        .expect("leasehold inject runs");
    let notes = String::from_utf8_lossy(&injected.stderr);
    assert!(injected.status.success(), "{notes}");
    assert_eq!(notes.matches(": injected").count(), 3, "{notes}");
    assert!(
        notes.contains("Deployment batch/consumer: injected: container consumer runs under leasehold run"),
        "{notes}"
    );
    let output = std::env::temp_dir().join(format!("leasehold-injected-examples-{}.yaml", std::process::id()));
    std::fs::write(&output, &injected.stdout).unwrap();
    let out = Command::new(&python)
        .arg(root.join("scripts/check-manifests.py"))
        .arg(&output)
        .output()
        .expect("python runs");
    std::fs::remove_file(&output).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(": 0 problems"), "{stdout}");
}

/// Every environment variable the chart and install.yaml give the operator is
/// one `leasehold operator` reads, the pod's identity under the sidecar's
/// downward-API names (a misspelt name is silently ignored by
/// the process), and the chart's sidecar defaults are the code's.
#[test]
fn the_operator_environment_and_sidecar_defaults_match_the_code() {
    use clap::CommandFactory;
    let cli = leasehold::cmd::Cli::command();
    let operator = cli.find_subcommand("operator").expect("an operator subcommand");
    let known: Vec<String> = cli
        .get_arguments()
        .chain(operator.get_arguments())
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .collect();
    for file in ["charts/leasehold/templates/deployment.yaml", "manifests/install.yaml"] {
        let text = read(file);
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- name: "))
            .filter(|n| n.starts_with("LEASEHOLD_") || n.starts_with("POD_"))
            .collect();
        assert!(names.contains(&"LEASEHOLD_SIDECAR_METRICS_PORT"), "{file}: {names:?}");
        // The downward API under the sidecar's names, which the operator reads too.
        for name in [
            leasehold::api::contract::ENV_POD_NAME,
            leasehold::api::contract::ENV_POD_NAMESPACE,
        ] {
            assert!(names.contains(&name), "{file}: {names:?}");
        }
        for name in names {
            assert!(
                known.iter().any(|r| r == name),
                "{file} sets {name}, which the operator does not read"
            );
        }
    }
    let values: serde_yaml::Value = serde_yaml::from_str(&read("charts/leasehold/values.yaml")).unwrap();
    assert_eq!(
        values["sidecar"]["metricsPort"].as_u64(),
        Some(leasehold::api::contract::DEFAULT_METRICS_PORT.into())
    );
    assert_eq!(values["sidecar"]["mode"].as_str(), Some("native"));
    assert!(read("manifests/install.yaml").contains(&format!(
        "- name: LEASEHOLD_SIDECAR_METRICS_PORT\n              value: \"{}\"",
        leasehold::api::contract::DEFAULT_METRICS_PORT
    )));
}
