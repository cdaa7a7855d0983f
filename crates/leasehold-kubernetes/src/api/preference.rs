//! Preferred candidates (issue 35, docs/design.md "Preferred candidates"):
//! how a candidate pod ranks, from its `leasehold.dev/priority` label or
//! annotation and its zone. The one parser of the priority; the operator
//! (which moves leadership) and `leasehold check` (which warns) both read it.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

/// The pod label or annotation carrying a candidate's priority: an integer,
/// higher leads. Absent: 0. A label value cannot start with `-`, so a
/// negative priority is an annotation.
pub const PRIORITY_KEY: &str = "leasehold.dev/priority";

/// The zone label. Since Kubernetes 1.35 the PodTopologyLabels admission
/// plugin (KEP-4742, beta and on by default; kubernetes
/// `plugin/pkg/admission/podtopologylabels`) copies the node's
/// `topology.kubernetes.io/zone` and `region` labels onto the pod when it is
/// bound, so neither the operator nor the sidecar reads Nodes. On a cluster
/// without it a pod has no zone unless its template sets one, and ranks as
/// in no preferred zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// How long a candidate must outrank the leader, ready all the time, before
/// leadership moves to it, unless `spec.preferenceStabilization` says otherwise.
pub const DEFAULT_STABILIZATION: Duration = Duration::from_secs(30);

/// A priority that is not an integer, or a label and an annotation that disagree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PriorityError {
    #[error("pod {pod}: {PRIORITY_KEY} {place} {value:?} is not an integer")]
    NotAnInteger {
        pod: String,
        place: &'static str,
        value: String,
    },
    #[error("pod {pod}: {PRIORITY_KEY} is {label:?} as a label and {annotation:?} as an annotation: set one")]
    Disagree {
        pod: String,
        label: String,
        annotation: String,
    },
}

/// A candidate's standing: priority first (set per pod, the operator's
/// explicit wish), then the position of its zone in `preferZones` (earlier
/// is better; no zone or one not listed ranks after every listed zone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rank {
    pub priority: i64,
    /// Index into `preferZones`; its length when not in a preferred zone.
    pub zone_place: usize,
}

impl Ord for Rank {
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then(other.zone_place.cmp(&self.zone_place))
    }
}

impl PartialOrd for Rank {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The pod's priority: its label or annotation (equal if both are set), 0
/// when neither is.
pub fn priority_of(pod: &Pod) -> Result<i64, PriorityError> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let read = |map: &Option<BTreeMap<String, String>>| map.as_ref().and_then(|m| m.get(PRIORITY_KEY)).cloned();
    let parse = |place: &'static str, value: &str| {
        value.trim().parse::<i64>().map_err(|_| PriorityError::NotAnInteger {
            pod: name.clone(),
            place,
            value: value.to_string(),
        })
    };
    match (read(&pod.metadata.labels), read(&pod.metadata.annotations)) {
        (None, None) => Ok(0),
        (Some(label), None) => parse("label", &label),
        (None, Some(annotation)) => parse("annotation", &annotation),
        (Some(label), Some(annotation)) => {
            let (l, a) = (parse("label", &label)?, parse("annotation", &annotation)?);
            match l == a {
                true => Ok(l),
                false => Err(PriorityError::Disagree {
                    pod: name,
                    label,
                    annotation,
                }),
            }
        }
    }
}

/// The zone of a pod with these labels, if it has one.
pub fn zone_of(labels: &BTreeMap<String, String>) -> Option<&str> {
    labels.get(ZONE_LABEL).map(String::as_str)
}

/// The rank of a pod of `priority` in `zone` under `prefer_zones`.
pub fn rank(priority: i64, zone: Option<&str>, prefer_zones: &[String]) -> Rank {
    let zone_place = zone
        .and_then(|zone| prefer_zones.iter().position(|z| z == zone))
        .unwrap_or(prefer_zones.len());
    Rank { priority, zone_place }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::ResourceExt as _;

    fn pod(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Pod {
        let map = |pairs: &[(&str, &str)]| Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        Pod {
            metadata: ObjectMeta {
                name: Some("web-0".into()),
                labels: map(labels),
                annotations: map(annotations),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[test]
    fn priority_from_label_or_annotation_defaults_to_zero() {
        assert_eq!(priority_of(&pod(&[], &[])), Ok(0));
        assert_eq!(priority_of(&pod(&[(PRIORITY_KEY, "5")], &[])), Ok(5));
        assert_eq!(priority_of(&pod(&[], &[(PRIORITY_KEY, "-3")])), Ok(-3));
        assert_eq!(priority_of(&pod(&[(PRIORITY_KEY, "2")], &[(PRIORITY_KEY, "2")])), Ok(2));
    }

    #[test]
    fn a_bad_priority_is_an_error_naming_pod_and_value() {
        let error = priority_of(&pod(&[(PRIORITY_KEY, "high")], &[])).unwrap_err();
        assert_eq!(
            error.to_string(),
            "pod web-0: leasehold.dev/priority label \"high\" is not an integer"
        );
        let error = priority_of(&pod(&[(PRIORITY_KEY, "1")], &[(PRIORITY_KEY, "2")])).unwrap_err();
        assert!(matches!(error, PriorityError::Disagree { .. }), "{error}");
        assert!(priority_of(&pod(&[], &[(PRIORITY_KEY, "1.5")])).is_err());
    }

    #[test]
    fn priority_outranks_zone_and_earlier_zones_outrank_later() {
        let zones = vec!["a".to_string(), "b".to_string()];
        let rank = |labels: &[(&str, &str)]| {
            let pod = pod(labels, &[]);
            rank(priority_of(&pod).unwrap(), zone_of(pod.labels()), &zones)
        };
        let in_a = rank(&[(ZONE_LABEL, "a")]);
        let in_b = rank(&[(ZONE_LABEL, "b")]);
        let nowhere = rank(&[]);
        let elsewhere = rank(&[(ZONE_LABEL, "c")]);
        assert!(in_a > in_b && in_b > nowhere);
        assert_eq!(nowhere.cmp(&elsewhere), Ordering::Equal);
        assert!(rank(&[(PRIORITY_KEY, "1")]) > in_a);
    }
}
