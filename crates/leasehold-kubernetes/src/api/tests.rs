use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

use super::*;

const CRD_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../crds/");

fn lease(spec: Value) -> DistributedLease {
    client::object_from_value(&json!({
        "apiVersion": "leasehold.dev/v1alpha1",
        "kind": "DistributedLease",
        "metadata": {"name": "web", "namespace": "prod"},
        "spec": spec,
    }))
    .expect("test resource deserializes")
}

fn valid_spec() -> Value {
    json!({
        "store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
        "selector": {"matchLabels": {"app": "web"}},
    })
}

/// `lease` split into `n` partitions.
fn partitioned(mut lease: DistributedLease, n: u32) -> DistributedLease {
    lease.spec.partitions = Some(n);
    lease
}

fn with(path: &[&str], value: Value) -> DistributedLease {
    let mut spec = valid_spec();
    let (last, parents) = path.split_last().expect("path not empty");
    let mut node = &mut spec;
    for key in parents {
        node = node
            .as_object_mut()
            .expect("object")
            .entry(*key)
            .or_insert_with(|| json!({}));
    }
    node[*last] = value;
    lease(spec)
}

#[test]
fn crds_folder_matches_the_code() {
    let mut files: Vec<String> = std::fs::read_dir(CRD_DIR)
        .expect("crds/")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut generated: Vec<&str> = crds().iter().map(|(file, _)| *file).collect();
    generated.sort();
    assert_eq!(files, generated, "crds/ holds one file per CRD, no other");
    for (file, crd) in crds() {
        let generated = serde_yaml::to_string(&crd).expect("CRD serializes");
        let on_disk = std::fs::read_to_string(format!("{CRD_DIR}{file}")).unwrap_or_default();
        assert!(
            generated == on_disk,
            "crds/{file} differs from the types; regenerate it from `cargo run -- crd` (one document per CRD)"
        );
    }
}

/// The API server only accepts structural schemas
/// (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema).
#[test]
fn the_schema_is_structural() {
    for (_, crd) in crds() {
        // Through YAML, as the API server receives it.
        let crd: CustomResourceDefinition = serde_yaml::from_str(&serde_yaml::to_string(&crd).unwrap()).unwrap();
        check_version_structural(&crd);
    }
}

fn check_version_structural(crd: &CustomResourceDefinition) {
    let version = &crd.spec.versions[0];
    let schema = serde_json::to_value(&version.schema.as_ref().unwrap().open_api_v3_schema).unwrap();
    let mut problems = Vec::new();
    check_structural(&schema, "openAPIV3Schema", &mut problems);
    assert_eq!(problems, Vec::<String>::new());
    // Every printer column points at a field the schema has.
    for column in version.additional_printer_columns.as_ref().unwrap() {
        let path = column.json_path.trim_start_matches('.');
        if path == "metadata.creationTimestamp" {
            continue;
        }
        let mut node = &schema;
        for part in path.split('.') {
            node = &node["properties"][part];
        }
        assert_eq!(node["type"], json!(column.type_), "printer column {}", column.name);
    }
}

fn check_structural(schema: &Value, at: &str, problems: &mut Vec<String>) {
    let Some(object) = schema.as_object() else {
        problems.push(format!("{at}: not an object"));
        return;
    };
    for forbidden in [
        "$ref",
        "$schema",
        "definitions",
        "$defs",
        "oneOf",
        "anyOf",
        "allOf",
        "not",
    ] {
        if object.contains_key(forbidden) {
            problems.push(format!("{at}: has {forbidden}"));
        }
    }
    // Nothing in this CRD is meant to keep unknown fields.
    if object.contains_key("x-kubernetes-preserve-unknown-fields") {
        problems.push(format!("{at}: x-kubernetes-preserve-unknown-fields"));
    }
    let Some(kind) = object.get("type").and_then(Value::as_str) else {
        problems.push(format!("{at}: no type"));
        return;
    };
    match kind {
        "object" => {
            let properties = object.get("properties").and_then(Value::as_object);
            let additional = object.get("additionalProperties");
            if properties.is_some() && additional.is_some() {
                problems.push(format!("{at}: both properties and additionalProperties"));
            }
            if let Some(properties) = properties {
                for (name, child) in properties {
                    check_structural(child, &format!("{at}.{name}"), problems);
                }
                for required in object.get("required").and_then(Value::as_array).into_iter().flatten() {
                    if !properties.contains_key(required.as_str().unwrap_or_default()) {
                        problems.push(format!("{at}: required {required} is not a property"));
                    }
                }
            }
            if let Some(additional) = additional {
                check_structural(additional, &format!("{at}.*"), problems);
            }
        }
        "array" => match object.get("items") {
            Some(items) => {
                check_structural(items, &format!("{at}[]"), problems);
                if object.get("x-kubernetes-list-type") == Some(&json!("map")) {
                    let keys = object["x-kubernetes-list-map-keys"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    let required = items["required"].as_array().cloned().unwrap_or_default();
                    if keys.is_empty() || !keys.iter().all(|k| required.contains(k)) {
                        problems.push(format!("{at}: list-map keys must be required in the items"));
                    }
                }
            }
            None => problems.push(format!("{at}: array without items")),
        },
        "string" | "integer" | "number" | "boolean" => {}
        other => problems.push(format!("{at}: unknown type {other}")),
    }
    if let Some(rules) = object.get("x-kubernetes-validations").and_then(Value::as_array) {
        for rule in rules {
            if rule["rule"].as_str().is_none_or(str::is_empty) {
                problems.push(format!("{at}: validation rule without a rule"));
            }
        }
    }
}

#[test]
fn the_crd_names_group_kind_and_columns() {
    let crd = DistributedLease::crd();
    assert_eq!(crd.spec.group, "leasehold.dev");
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.short_names, Some(vec!["dlease".to_string()]));
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<_> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["Holder", "Cluster", "Term", "Version", "Members", "Age"]);
    let spec = serde_json::to_value(version.schema.as_ref().unwrap()).unwrap()["openAPIV3Schema"]["properties"]["spec"]
        .clone();
    let rules: Vec<&str> = spec["x-kubernetes-validations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rule"].as_str().unwrap())
        .collect();
    assert_eq!(
        rules,
        [
            "duration(self.renewDeadline) < duration(self.leaseDuration)",
            "duration(self.retryPeriod) < duration(self.renewDeadline)",
            "duration(self.retryPeriod) > duration('0s')",
            "has(self.lockName) == has(oldSelf.lockName)",
            "self.store == oldSelf.store",
            "has(self.partitions) == has(oldSelf.partitions) && (!has(self.partitions) || self.partitions == oldSelf.partitions)",
        ]
    );
}

/// That the schema carries the rules; what they do on a real API server is
/// `tests/e2e/cel.rs`. `lockName: self == oldSelf` is a transition rule the API server skips
/// when the field is added or removed (a transition rule runs only when the
/// old object has the field too); the parent-level rule covers both.
#[test]
fn lock_name_can_be_neither_changed_nor_added_nor_removed() {
    let crd = serde_json::to_value(DistributedLease::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let field_rules = &spec["properties"]["lockName"]["x-kubernetes-validations"];
    assert_eq!(field_rules[0]["rule"], json!("self == oldSelf"));
    let parent = spec["x-kubernetes-validations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == json!("has(self.lockName) == has(oldSelf.lockName)"))
        .expect("a spec-level rule compares presence of lockName in old and new");
    assert_eq!(parent["fieldPath"], json!(".lockName"));
    assert!(
        parent["message"]
            .as_str()
            .unwrap()
            .contains("cannot be added or removed")
    );
}

/// Issue 40: the store block and the partitions are immutable by spec-level
/// transition rules (a field's own rule would miss adding and removing),
/// and their messages name the way to move a lease. What the API server
/// does with them: `tests/e2e/cel.rs`.
#[test]
fn store_and_partitions_are_immutable_and_the_messages_name_the_migration() {
    let crd = serde_json::to_value(DistributedLease::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let rules = spec["x-kubernetes-validations"].as_array().unwrap();
    let rule_of = |path: &str| {
        rules
            .iter()
            .find(|r| r["fieldPath"] == json!(path) && r["rule"].as_str().unwrap().contains("oldSelf"))
            .unwrap_or_else(|| panic!("a transition rule on {path}"))
    };
    assert_eq!(rule_of(".store")["rule"], json!("self.store == oldSelf.store"));
    assert_eq!(rule_of(".store")["message"], json!(STORE_IMMUTABLE));
    let partitions = rule_of(".partitions");
    assert!(
        partitions["rule"]
            .as_str()
            .unwrap()
            .starts_with("has(self.partitions) == has(oldSelf.partitions)")
    );
    assert_eq!(partitions["message"], json!(PARTITIONS_IMMUTABLE));
    for message in [STORE_IMMUTABLE, PARTITIONS_IMMUTABLE] {
        assert!(
            message.contains("delete the DistributedLease, wait until it is gone")
                && message.contains("docs/migrating-stores.md"),
            "{message}"
        );
    }
}

#[test]
fn defaults_fill_in_and_the_lock_defaults_to_namespace_and_name() {
    let lease = lease(valid_spec());
    assert_eq!(lease.spec.lease_duration, "15s");
    assert_eq!(lease.spec.store.spanner.as_ref().unwrap().table, DEFAULT_TABLE);
    assert_eq!(lease.spec.publishing.label_key, DEFAULT_LABEL_KEY);
    let valid = validate(&lease).unwrap();
    assert_eq!(valid.lock, "prod/web");
    assert_eq!(valid.timing.lease_duration, Duration::from_secs(15));
    assert_eq!(valid.timing.renew_deadline, Duration::from_secs(10));
    assert_eq!(valid.timing.retry_period, Duration::from_secs(2));
    assert_eq!(
        valid.timing,
        leasehold_core::lease::Timing::default(),
        "the resource's defaults, jitter included, are the elector's"
    );
    assert_eq!(valid.selector.to_string(), "app=web");
    assert_eq!(
        valid.store,
        ValidStore::Spanner(leasehold_stores::spanner::SpannerConfig {
            database: "projects/p/instances/i/databases/d".into(),
            table: DEFAULT_TABLE.into()
        })
    );
    assert!(!valid.readiness_gate);

    let named = with(&["lockName"], json!("global/payments"));
    assert_eq!(validate(&named).unwrap().lock, "global/payments");
}

#[test]
fn each_invalid_field_gets_its_own_message() {
    let cases: Vec<(DistributedLease, &str)> = vec![
        (with(&["lockName"], json!(" ")), "spec.lockName must not be empty"),
        (
            with(&["lockName"], json!("a\nb")),
            "spec.lockName must not contain control characters",
        ),
        (
            with(&["store", "spanner", "database"], json!("mydb")),
            "spec.store.spanner.database must look like projects/<project>/instances/<instance>/databases/<database>, got \"mydb\"",
        ),
        (
            with(
                &["store", "spanner", "database"],
                json!("projects/p/instances//databases/d"),
            ),
            "spec.store.spanner.database must look like",
        ),
        (
            with(&["store", "spanner", "table"], json!("1leases")),
            "spec.store.spanner.table must be a letter followed by",
        ),
        (
            with(&["store", "spanner", "table"], json!("lease-table")),
            "spec.store.spanner.table must be a letter followed by",
        ),
        (
            with(&["leaseDuration"], json!("soon")),
            "spec.leaseDuration: invalid duration \"soon\"",
        ),
        (
            with(&["renewDeadline"], json!("0s")),
            "spec.renewDeadline must be greater than zero",
        ),
        (
            with(&["renewDeadline"], json!("20s")),
            "spec.renewDeadline (20s) must be shorter than leaseDuration (15s)",
        ),
        (
            with(&["retryPeriod"], json!("10s")),
            "spec.retryPeriod (10s) must be shorter than renewDeadline (10s)",
        ),
        (
            with(&["retryPeriod"], json!("9s")),
            "spec.retryPeriod (9s) with jitter 0.2 can exceed renewDeadline (10s)",
        ),
        (with(&["selector"], json!({})), "spec.selector must not be empty"),
        (
            with(
                &["selector"],
                json!({"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}),
            ),
            "spec.selector.matchExpressions[0] (key \"app\") takes no values",
        ),
        (
            with(
                &["selector"],
                json!({"matchExpressions": [{"key": "app", "operator": "In"}]}),
            ),
            "spec.selector.matchExpressions[0] (key \"app\") needs values",
        ),
        (
            with(
                &["selector"],
                json!({"matchExpressions": [{"key": "app", "operator": "Near", "values": ["x"]}]}),
            ),
            "spec.selector.matchExpressions[0] (key \"app\") has operator \"Near\"",
        ),
        (
            with(&["publishing", "labelKey"], json!("leader!")),
            "spec.publishing.labelKey must be a label key",
        ),
        (
            with(&["publishing", "labelKey"], json!("Leasehold.Dev/leader")),
            "spec.publishing.labelKey prefix must be a lowercase DNS subdomain",
        ),
        (
            with(&["publishing", "labelKey"], json!(format!("x/{}", "a".repeat(64)))),
            "spec.publishing.labelKey must be a label key",
        ),
        (
            {
                let mut gated = with(&["retryPeriod"], json!("7s"));
                gated.spec.publishing.readiness_gate = true;
                gated
            },
            "spec.publishing.readinessGate needs renewDeadline − retryPeriod (with jitter) above 2s",
        ),
        (
            with(&["partitions"], json!(0)),
            "spec.partitions must be between 1 and 1024, not 0",
        ),
        (
            partitioned(with(&["lockName"], json!("x".repeat(506))), 4),
            "spec.lockName is 506 bytes long; a partitioned lock's name is at most 505 bytes",
        ),
        (
            partitioned(with(&["publishing", "readinessGate"], json!(true)), 4),
            "spec.partitions cannot be combined with spec.publishing.readinessGate",
        ),
        (
            partitioned(with(&["leadership", "prefer"], json!("Newest")), 4),
            "spec.partitions cannot be combined with spec.leadership",
        ),
        (
            partitioned(with(&["store"], json!({"kubernetes": {}})), 4),
            "spec.partitions needs store.spanner, store.postgres or store.redis",
        ),
    ];
    let count = cases.len();
    let mut messages = BTreeSet::new();
    for (lease, expected) in cases {
        let message = validate(&lease).unwrap_err().to_string();
        assert!(message.starts_with(expected), "got {message:?}, want {expected:?}");
        messages.insert(message);
    }
    assert_eq!(messages.len(), count, "every case has its own message: {messages:#?}");
}

/// PostgreSQL and Redis leases name a Secret key, never a URL; exactly one
/// store, said by CEL in the schema and again by [`validate`].
#[test]
fn postgres_and_redis_leases_reference_a_secret_and_exactly_one_store_is_set() {
    let secret = json!({"urlSecretRef": {"name": "leases-db"}});
    let postgres = with(&["store"], json!({"postgres": secret}));
    assert_eq!(
        validate(&postgres).unwrap().store,
        ValidStore::Postgres {
            url_secret: SecretKeyRef {
                name: "leases-db".into(),
                key: "url".into()
            },
            table: DEFAULT_TABLE.into()
        }
    );
    let redis = with(
        &["store"],
        json!({"redis": {"urlSecretRef": {"name": "cache", "key": "redis-url"}}}),
    );
    let valid = validate(&redis).unwrap();
    assert_eq!(
        valid.store.to_string(),
        "Redis at the URL in Secret cache key redis-url"
    );
    let cases: Vec<(DistributedLease, &str)> = vec![
        (
            with(&["store", "postgres"], secret.clone()),
            "spec.store must set exactly one of spanner, postgres, redis and kubernetes",
        ),
        (with(&["store"], json!({})), "spec.store must set exactly one"),
        (
            with(&["store"], json!({"postgres": {"urlSecretRef": {"name": "Leases_DB"}}})),
            "spec.store.postgres.urlSecretRef.name must be a Secret name",
        ),
        (
            with(
                &["store"],
                json!({"redis": {"urlSecretRef": {"name": "c", "key": "a/b"}}}),
            ),
            "spec.store.redis.urlSecretRef.key must be a Secret key",
        ),
        (
            with(
                &["store"],
                json!({"postgres": {"urlSecretRef": {"name": "db"}, "table": "t".repeat(49)}}),
            ),
            "spec.store.postgres.table must be a letter followed by up to 47",
        ),
    ];
    for (lease, expected) in cases {
        let message = validate(&lease).unwrap_err().to_string();
        assert!(message.starts_with(expected), "got {message:?}, want {expected:?}");
    }
    // No field of the store schema can hold a URL or a password.
    let crd = serde_json::to_value(DistributedLease::crd()).unwrap();
    let store = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["store"];
    assert_eq!(
        store["x-kubernetes-validations"][0]["rule"],
        "[has(self.spanner), has(self.postgres), has(self.redis), has(self.kubernetes)].filter(x, x).size() == 1"
    );
    let fields = |kind: &str| -> Vec<String> {
        store["properties"][kind]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    assert_eq!(fields("postgres"), ["table", "urlSecretRef"]);
    assert_eq!(fields("redis"), ["urlSecretRef"]);
}

/// `store: {kubernetes: {}}` names Leases in the resource's namespace, and
/// counts as a store of its own in "exactly one".
#[test]
fn a_kubernetes_lease_names_leases_in_its_namespace_and_no_other_store() {
    let kubernetes = with(&["store"], json!({"kubernetes": {}}));
    let valid = validate(&kubernetes).unwrap();
    assert_eq!(valid.store, ValidStore::Kubernetes);
    assert_eq!(valid.store.url_secret(), None);
    let both = with(&["store", "kubernetes"], json!({}));
    let message = validate(&both).unwrap_err().to_string();
    assert!(
        message.starts_with("spec.store must set exactly one of spanner, postgres, redis and kubernetes"),
        "{message}"
    );
}

#[test]
fn selectors_with_expressions_render_for_the_api() {
    let lease = with(
        &["selector"],
        json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}),
    );
    assert_eq!(validate(&lease).unwrap().selector.to_string(), "app=web,tier in (a,b)");
}

#[test]
fn status_serializes_camel_case_and_skips_absent_fields() {
    let status = DistributedLeaseStatus {
        holder: Some("prod/web-0#ab".into()),
        term: Some(3),
        token: Some("17".into()),
        ready_candidates: 2,
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_value(&status).unwrap(),
        json!({"conditions": [], "holder": "prod/web-0#ab", "term": 3, "token": "17", "transitions": 0,
               "candidates": 0, "readyCandidates": 2})
    );
}

/// The API server warns on a CRD whose schema uses formats it does not know
/// (apiextensions' `supportedFormats`); schemars' `uint32`/`uint64` are such.
#[test]
fn the_crd_uses_only_formats_the_api_server_knows() {
    fn formats(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(format)) = map.get("format") {
                    out.push(format.clone());
                }
                map.values().for_each(|v| formats(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| formats(v, out)),
            _ => {}
        }
    }
    let crd = serde_json::to_value(DistributedLease::crd()).unwrap();
    let mut found = Vec::new();
    formats(&crd, &mut found);
    let known = [
        "int32",
        "int64",
        "float",
        "double",
        "byte",
        "date",
        "date-time",
        "password",
    ];
    let unknown: Vec<_> = found.iter().filter(|f| !known.contains(&f.as_str())).collect();
    assert!(unknown.is_empty(), "formats the API server warns about: {unknown:?}");
    assert!(found.iter().any(|f| f == "int64"));
}

/// Issue 16: leadership defaults to version-blind (existing resources keep
/// today's behaviour); `prefer` and `versionFence` reach the valid lease.
#[test]
fn leadership_defaults_to_version_blind_and_is_parsed() {
    use leasehold_core::lease::{Prefer, VersionPolicy};
    let mut lease: DistributedLease = client::object_from_value(&serde_json::json!({
        "apiVersion": "leasehold.dev/v1alpha1",
        "kind": "DistributedLease",
        "metadata": {"name": "web", "namespace": "prod"},
        "spec": {
            "store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
            "selector": {"matchLabels": {"app": "web"}}
        }
    }))
    .unwrap();
    assert_eq!(validate(&lease).unwrap().versions, VersionPolicy::default());
    assert_eq!(VersionPolicy::default().prefer, Prefer::None);
    lease.spec.leadership =
        client::object_from_value(&serde_json::json!({"prefer": "Newest", "versionFence": true})).unwrap();
    assert_eq!(
        validate(&lease).unwrap().versions,
        VersionPolicy {
            prefer: Prefer::Newest,
            fence: true
        }
    );
    assert!(client::object_from_value::<LeadershipSpec>(&serde_json::json!({"prefer": "Latest"})).is_err());
}

#[test]
fn partitions_default_to_a_single_lock_and_are_parsed() {
    let lease = with(&["publishing", "labelKey"], json!(DEFAULT_LABEL_KEY));
    assert_eq!(validate(&lease).unwrap().partitions, None);
    assert_eq!(validate(&partitioned(lease, 64)).unwrap().partitions, Some(64));
    // Issue 28: PostgreSQL and Redis keep sessions too.
    for store in [
        json!({"postgres": {"urlSecretRef": {"name": "db", "key": "url"}}}),
        json!({"redis": {"urlSecretRef": {"name": "redis", "key": "url"}}}),
    ] {
        let lease = partitioned(with(&["store"], store.clone()), 4);
        assert_eq!(validate(&lease).unwrap().partitions, Some(4), "{store}");
    }
}

/// A kubeconfig whose client certificate is X.509 version 1 (what
/// `openssl x509 -req` without extensions issues): the error names the
/// user and the file, not only webpki's `UnsupportedCertVersion`.
#[tokio::test]
async fn a_version_1_client_certificate_is_named() {
    let dir = leasehold_testkit::servers::scratch_dir("v1-cert");
    let (key, cert) = (dir.join("v1.key"), dir.join("v1.crt"));
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=v1", "-days", "1",
        ])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (Debian: apt-get install openssl)");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    // `req -x509` makes version 3; re-sign the same request as version 1.
    let csr = dir.join("v1.csr");
    let signed = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl req -new -key {key} -subj /CN=v1 -out {csr} && openssl x509 -req -in {csr} -signkey {key} -days 1 -out {cert}",
            key = key.display(),
            csr = csr.display(),
            cert = cert.display()
        ))
        .output()
        .expect("openssl");
    assert!(signed.status.success(), "{}", String::from_utf8_lossy(&signed.stderr));
    let kubeconfig: kube::config::Kubeconfig = serde_yaml::from_str(&format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
         clusters: [{{name: k, cluster: {{server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}}}]\n\
         users: [{{name: tester, user: {{client-certificate: {}, client-key: {}}}}}]\n\
         contexts: [{{name: c, context: {{cluster: k, user: tester}}}}]\n",
        cert.display(),
        key.display()
    ))
    .unwrap();
    let Err(error) = client::client_for(kubeconfig, None).await else {
        panic!("a version 1 client certificate was accepted");
    };
    let message = error.to_string();
    assert!(message.contains("kubeconfig user tester"), "{message}");
    assert!(message.contains(&format!("file {}", cert.display())), "{message}");
    assert!(message.contains("X.509 version 1"), "{message}");
}
