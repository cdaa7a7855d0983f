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

/// Every `rules:` list in the YAML code blocks of a document, as written,
/// so a test can compare a doc with the code for equality, not containment.
#[cfg(test)]
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

#[cfg(test)]
mod tests {
    use super::*;

    const PODS: &[Rule] = &[Rule {
        api_group: "",
        resources: &["pods"],
        verbs: &["get"],
    }];

    #[test]
    fn a_doc_with_an_extra_rule_is_not_equal_to_the_code() {
        let exact = format!("text\n```yaml\nkind: Role\n{}```\n", rules_yaml(PODS));
        assert_eq!(rules_lists_in(&exact), [rules_yaml(PODS)]);
        let extra = exact.replace(
            "```\n",
            "  - apiGroups: [\"\"]\n    resources: [secrets]\n    verbs: [get]\n```\n",
        );
        assert_ne!(
            rules_lists_in(&extra),
            [rules_yaml(PODS)],
            "containment would have passed"
        );
        assert!(extra.contains(&rules_yaml(PODS)));
    }
}
