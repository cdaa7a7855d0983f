//! The Kubernetes permissions the operator uses, and nothing more.
//!
//! The wire-level tests check every request a reconcile makes against these
//! rules, and `docs/rbac-operator.md` carries them as a ClusterRole, so the
//! chart's RBAC cannot drift from the code silently.

/// One ClusterRole rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub api_group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
}

pub const RULES: &[Rule] = &[
    // The controller's list+watch; finalizers by merge patch; the injection
    // webhook reads the lease a pod names.
    Rule {
        api_group: "leasehold.dev",
        resources: &["distributedleases"],
        verbs: &["get", "list", "watch", "patch"],
    },
    // Status by server-side apply.
    Rule {
        api_group: "leasehold.dev",
        resources: &["distributedleases/status"],
        verbs: &["patch"],
    },
    // Candidate counts and stale leader label repair.
    Rule {
        api_group: "",
        resources: &["pods"],
        verbs: &["list", "patch"],
    },
    // The rollout check for readiness-gated leases.
    Rule {
        api_group: "apps",
        resources: &["deployments"],
        verbs: &["get"],
    },
    // kube's event recorder creates events and patches repeats into series.
    Rule {
        api_group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
    },
    // The injection webhook's self-signed CA goes into its configuration.
    Rule {
        api_group: "admissionregistration.k8s.io",
        resources: &["mutatingwebhookconfigurations"],
        verbs: &["get", "patch"],
    },
];

/// Rules granted by a Role in the operator's own namespace only.
pub const NAMESPACED_RULES: &[Rule] = &[
    // The webhook certificate all replicas share (self-signed mode).
    Rule {
        api_group: "",
        resources: &["secrets"],
        verbs: &["get", "create"],
    },
];

/// The rules as the `rules:` list of a ClusterRole ([`RULES`]) or Role.
pub fn rules_yaml(rules: &[Rule]) -> String {
    let mut yaml = String::from("rules:\n");
    for rule in rules {
        yaml.push_str(&format!(
            "  - apiGroups: [\"{}\"]\n    resources: [{}]\n    verbs: [{}]\n",
            rule.api_group,
            rule.resources.join(", "),
            rule.verbs.join(", ")
        ));
    }
    yaml
}

/// Whether the rules allow `verb` on `resource` (with subresource, e.g.
/// `distributedleases/status`) in `api_group`.
pub fn allows(api_group: &str, resource: &str, verb: &str) -> bool {
    RULES
        .iter()
        .chain(NAMESPACED_RULES)
        .any(|r| r.api_group == api_group && r.resources.contains(&resource) && r.verbs.contains(&verb))
}

/// The API group, resource (with subresource) and RBAC verb of a request
/// path, for checking recorded requests against [`RULES`].
pub fn request_attributes(method: &str, path: &str, watch: bool) -> Option<(String, String, &'static str)> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _namespace, rest @ ..] if !rest.is_empty() => rest,
        rest => rest,
    };
    let (resource, named) = match rest {
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => return None,
    };
    let verb = match (method, named) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some((group.to_string(), resource, verb))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = include_str!("../../docs/rbac-operator.md");

    #[test]
    fn the_doc_carries_exactly_these_rules() {
        for rules in [RULES, NAMESPACED_RULES] {
            assert!(
                DOC.contains(&rules_yaml(rules)),
                "docs/rbac-operator.md must contain the rules as rbac::rules_yaml() renders them:\n{}",
                rules_yaml(rules)
            );
        }
    }

    #[test]
    fn request_paths_map_to_group_resource_and_verb() {
        let cases = [
            ("GET", "/api/v1/namespaces/prod/pods", false, ("", "pods", "list")),
            (
                "PATCH",
                "/api/v1/namespaces/prod/pods/web-0",
                false,
                ("", "pods", "patch"),
            ),
            (
                "PATCH",
                "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases/web/status",
                false,
                ("leasehold.dev", "distributedleases/status", "patch"),
            ),
            (
                "GET",
                "/apis/leasehold.dev/v1alpha1/distributedleases",
                true,
                ("leasehold.dev", "distributedleases", "watch"),
            ),
            (
                "POST",
                "/apis/events.k8s.io/v1/namespaces/prod/events",
                false,
                ("events.k8s.io", "events", "create"),
            ),
        ];
        for (method, path, watch, (group, resource, verb)) in cases {
            assert_eq!(
                request_attributes(method, path, watch),
                Some((group.to_string(), resource.to_string(), verb)),
                "{method} {path}"
            );
        }
        assert!(allows("", "pods", "patch"));
        assert!(!allows("", "pods", "delete"));
    }
}
