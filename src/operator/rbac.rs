//! The Kubernetes permissions the operator uses, and nothing more.
//!
//! The wire-level tests check every request a reconcile makes against these
//! rules, and `docs/rbac-operator.md` carries them as a ClusterRole, so the
//! chart's RBAC cannot drift from the code silently.

pub use crate::rbac::{Rule, named_rules_yaml, request_attributes, rules_yaml};

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
];

/// Rules granted for named objects only (`resourceNames`): the injection
/// webhook's self-signed CA goes into its own configuration
/// (--webhook-configuration), and into no other.
pub const WEBHOOK_CONFIGURATION_RULES: &[Rule] = &[Rule {
    api_group: "admissionregistration.k8s.io",
    resources: &["mutatingwebhookconfigurations"],
    verbs: &["get", "patch"],
}];

/// Rules granted by a Role in the operator's own namespace only.
pub const NAMESPACED_RULES: &[Rule] = &[
    // The webhook certificate all replicas share (self-signed mode).
    Rule {
        api_group: "",
        resources: &["secrets"],
        verbs: &["get", "create"],
    },
];

/// Whether the operator's rules allow `verb` on `resource` in `api_group`.
pub fn allows(api_group: &str, resource: &str, verb: &str) -> bool {
    [RULES, NAMESPACED_RULES, WEBHOOK_CONFIGURATION_RULES]
        .iter()
        .any(|rules| crate::rbac::grants(rules, api_group, resource, verb))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = include_str!("../../docs/rbac-operator.md");

    #[test]
    fn the_doc_carries_exactly_these_rules() {
        let cluster_role =
            rules_yaml(RULES) + &named_rules_yaml(WEBHOOK_CONFIGURATION_RULES, "leasehold-sidecar-injector");
        assert_eq!(
            crate::rbac::rules_lists_in(DOC),
            [cluster_role, rules_yaml(NAMESPACED_RULES)],
            "docs/rbac-operator.md must carry exactly the ClusterRole and Role rules, as rbac::rules_yaml() renders them"
        );
    }

    #[test]
    fn the_doc_limits_the_webhook_configuration_by_name() {
        let named = named_rules_yaml(WEBHOOK_CONFIGURATION_RULES, "leasehold-sidecar-injector");
        assert!(
            named.contains("    resourceNames: [leasehold-sidecar-injector]\n"),
            "{named}"
        );
        assert!(DOC.contains(&named), "docs/rbac-operator.md must contain:\n{named}");
        assert!(!rules_yaml(RULES).contains("mutatingwebhookconfigurations"));
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
