//! RBAC rules as data: what the operator and the sidecar may call, checked
//! against the requests their wire-level tests record, and rendered into the
//! docs the chart's roles are written from.

/// One ClusterRole rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub api_group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
    /// Objects the rule is limited to; empty means every object. RBAC cannot
    /// limit `create` (nor `list`/`watch` without a name) this way
    /// (https://kubernetes.io/docs/reference/access-authn-authz/rbac/#referring-to-resources).
    pub resource_names: &'static [&'static str],
}

/// What RBAC authorizes for one request: API group, resource (with
/// subresource, e.g. `distributedleases/status`), object name and verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestAttributes {
    pub api_group: String,
    pub resource: String,
    pub name: Option<String>,
    pub verb: &'static str,
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
        if !rule.resource_names.is_empty() {
            yaml.push_str(&format!("    resourceNames: [{}]\n", rule.resource_names.join(", ")));
        }
    }
    yaml
}

/// Every `rules:` list in the YAML code blocks of a document, as written,
/// so a test can compare a doc with the code for equality, not containment.
pub fn rules_lists_in(doc: &str) -> Vec<String> {
    let mut lists = Vec::new();
    for block in doc.split("```yaml\n").skip(1) {
        let block = block.split("```").next().unwrap_or_default();
        for list in block.split("rules:\n").skip(1) {
            let items: String = list
                .lines()
                .take_while(|l| l.starts_with("  "))
                .map(|l| format!("{l}\n"))
                .collect();
            lists.push(format!("rules:\n{items}"));
        }
    }
    lists
}

/// Whether `rules` allow `request`: a rule with resource names matches only
/// a request for one of those objects.
pub fn grants(rules: &[Rule], request: &RequestAttributes) -> bool {
    rules.iter().any(|r| {
        r.api_group == request.api_group
            && r.resources.contains(&request.resource.as_str())
            && r.verbs.contains(&request.verb)
            && (r.resource_names.is_empty()
                || request
                    .name
                    .as_deref()
                    .is_some_and(|name| r.resource_names.contains(&name)))
    })
}

/// The RBAC attributes of a request, for checking recorded requests against
/// a component's rules.
pub fn request_attributes(method: &str, path: &str, watch: bool) -> Option<RequestAttributes> {
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
    let (resource, name) = match rest {
        [resource] => (resource.to_string(), None),
        [resource, name] => (resource.to_string(), Some(name.to_string())),
        [resource, name, sub] => (format!("{resource}/{sub}"), Some(name.to_string())),
        _ => return None,
    };
    let verb = match (method, name.is_some()) {
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
    Some(RequestAttributes {
        api_group: group.to_string(),
        resource,
        name,
        verb,
    })
}
