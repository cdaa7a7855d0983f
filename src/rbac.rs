//! RBAC rules as data: what the operator and the sidecar may call, checked
//! against the requests their wire-level tests record, and rendered into the
//! docs the chart's roles are written from.

/// One ClusterRole rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub api_group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
}

/// The rules as the `rules:` list of a ClusterRole or Role.
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

/// Rules limited to the objects `names` (a YAML flow list's items, e.g. a
/// chart expression), as items to append to a `rules:` list.
pub fn named_rules_yaml(rules: &[Rule], names: &str) -> String {
    rules_yaml(rules)
        .trim_start_matches("rules:\n")
        .lines()
        .map(|line| format!("{line}\n"))
        .collect::<Vec<_>>()
        .chunks(3)
        .map(|rule| format!("{}    resourceNames: [{names}]\n", rule.concat()))
        .collect()
}

/// Whether `rules` allow `verb` on `resource` (with subresource, e.g.
/// `distributedleases/status`) in `api_group`.
pub fn grants(rules: &[Rule], api_group: &str, resource: &str, verb: &str) -> bool {
    rules
        .iter()
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
