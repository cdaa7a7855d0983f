//! The operator's caches indexed by label, so that neither a pod event nor
//! a reconcile looks at every lease or every pod. At 10,000 leases with 3
//! candidates each, matching each of the 30,000 pods of the initial list
//! against every lease held the pod cache back for minutes, and a scan of
//! every pod per reconcile made each one cost milliseconds (BENCHMARKS.md,
//! "The operator at many leases").
//!
//! Both indexes follow their watch's events as kube's reflector does with
//! its store: a re-list (`Init` … `InitApply` … `InitDone`) fills a new
//! index that replaces the old one when it is complete.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::core::{Expression, Selector, SelectorExt as _};
use kube::runtime::reflector::{self, Lookup, ObjectRef, Store, store::Writer};
use kube::runtime::watcher;

use crate::candidate::CandidatePod;
use leasehold_kubernetes::api::{DistributedLease, validate};

/// A label: key and value.
type Label = (String, String);

/// One namespace's objects: each one's entry, filed under some of its labels.
struct Namespace<E> {
    objects: HashMap<String, (E, Vec<Label>)>,
    /// Names by label key, then value.
    filed: HashMap<String, HashMap<String, HashSet<String>>>,
    /// Names filed under no label.
    unfiled: HashSet<String>,
}

impl<E> Default for Namespace<E> {
    fn default() -> Self {
        Namespace {
            objects: HashMap::new(),
            filed: HashMap::new(),
            unfiled: HashSet::new(),
        }
    }
}

/// Objects by namespace and label, following one watch.
struct LabelIndex<E> {
    live: HashMap<String, Namespace<E>>,
    /// Filled by a re-list in progress.
    relisting: Option<HashMap<String, Namespace<E>>>,
}

impl<E> Default for LabelIndex<E> {
    fn default() -> Self {
        LabelIndex {
            live: HashMap::new(),
            relisting: None,
        }
    }
}

impl<E> LabelIndex<E> {
    /// Follows one watch event; `entry` gives an object's entry and the
    /// labels to file it under, or `None` to leave it out.
    fn apply<K: Lookup>(&mut self, event: &watcher::Event<K>, entry: impl Fn(&K) -> Option<(E, Vec<Label>)>) {
        match event {
            watcher::Event::Apply(object) => {
                remove(&mut self.live, object);
                if let Some(entry) = entry(object) {
                    insert(&mut self.live, object, entry);
                }
            }
            watcher::Event::Delete(object) => remove(&mut self.live, object),
            watcher::Event::Init => self.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(object) => {
                let relisting = self.relisting.get_or_insert_default();
                if let Some(entry) = entry(object) {
                    insert(relisting, object, entry);
                }
            }
            watcher::Event::InitDone => self.live = self.relisting.take().unwrap_or_default(),
        }
    }

    /// The objects of `namespace` filed under `key=value`.
    fn filed_under<'a>(&'a self, namespace: &str, key: &str, value: &str) -> impl Iterator<Item = (&'a str, &'a E)> {
        let namespace = self.live.get(namespace);
        let names = namespace
            .and_then(|ns| ns.filed.get(key))
            .and_then(|values| values.get(value));
        names
            .into_iter()
            .flatten()
            .filter_map(move |name| Some((name.as_str(), &namespace?.objects.get(name)?.0)))
    }

    /// The objects of `namespace` filed under no label.
    fn unfiled<'a>(&'a self, namespace: &str) -> impl Iterator<Item = (&'a str, &'a E)> {
        let namespace = self.live.get(namespace);
        namespace
            .into_iter()
            .flat_map(|ns| ns.unfiled.iter())
            .filter_map(move |name| Some((name.as_str(), &namespace?.objects.get(name)?.0)))
    }

    /// Every object of `namespace`.
    fn all<'a>(&'a self, namespace: &str) -> impl Iterator<Item = (&'a str, &'a E)> {
        self.live
            .get(namespace)
            .into_iter()
            .flat_map(|ns| ns.objects.iter().map(|(name, (entry, _))| (name.as_str(), entry)))
    }
}

/// The object's namespace and name.
fn key_of<K: Lookup>(object: &K) -> (String, String) {
    let text = |field: Option<std::borrow::Cow<'_, str>>| field.unwrap_or_default().into_owned();
    (text(Lookup::namespace(object)), text(Lookup::name(object)))
}

fn insert<K: Lookup, E>(index: &mut HashMap<String, Namespace<E>>, object: &K, (entry, labels): (E, Vec<Label>)) {
    let (namespace, name) = key_of(object);
    let namespace = index.entry(namespace).or_default();
    if labels.is_empty() {
        namespace.unfiled.insert(name.clone());
    }
    for (key, value) in &labels {
        namespace
            .filed
            .entry(key.clone())
            .or_default()
            .entry(value.clone())
            .or_default()
            .insert(name.clone());
    }
    namespace.objects.insert(name, (entry, labels));
}

fn remove<K: Lookup, E>(index: &mut HashMap<String, Namespace<E>>, object: &K) {
    let (namespace_name, name) = key_of(object);
    let Some(namespace) = index.get_mut(&namespace_name) else {
        return;
    };
    let Some((_, labels)) = namespace.objects.remove(&name) else {
        return;
    };
    namespace.unfiled.remove(&name);
    for (key, value) in labels {
        if let Some(values) = namespace.filed.get_mut(&key) {
            if let Some(names) = values.get_mut(&value) {
                names.remove(&name);
                if names.is_empty() {
                    values.remove(&value);
                }
            }
            if values.is_empty() {
                namespace.filed.remove(&key);
            }
        }
    }
    if namespace.objects.is_empty() {
        index.remove(&namespace_name);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A label every object `selector` selects must carry (`key=value`, or
/// `key in (value)`), if it has one.
fn required_label(selector: &Selector) -> Option<Label> {
    selector.clone().into_iter().find_map(|expression| match expression {
        Expression::Equal(key, value) => Some((key, value)),
        Expression::In(key, values) if values.len() == 1 => Some((key, values.into_iter().next()?)),
        _ => None,
    })
}

/// The valid leases' selectors and readiness gates, filed under a label
/// each one requires: a pod event looks only at the leases filed under one
/// of the pod's labels, and at those whose selector requires none. Each
/// lease is validated once per event of its own (a status write is one),
/// not per pod event.
#[derive(Default)]
pub(crate) struct Selectors(Mutex<LabelIndex<(Selector, bool)>>);

impl Selectors {
    /// Follows the lease watch; an invalid spec selects nothing.
    pub(crate) fn follow(&self, event: &watcher::Event<DistributedLease>) {
        lock(&self.0).apply(event, |lease| {
            let valid = validate(lease).ok()?;
            let filed = required_label(&valid.selector).into_iter().collect();
            Some(((valid.selector, valid.readiness_gate), filed))
        });
    }

    /// The leases in the pod's namespace whose selector matches the pod.
    pub(crate) fn leases_selecting(&self, pod: &Pod) -> Vec<ObjectRef<DistributedLease>> {
        self.matching(pod.metadata.namespace.as_deref(), pod.labels(), false)
    }

    /// The readiness-gated leases in the Deployment's namespace whose selector
    /// matches its pod template's labels (the labels its pods get).
    pub(crate) fn gated_leases_of(&self, deployment: &Deployment) -> Vec<ObjectRef<DistributedLease>> {
        let labels = deployment
            .spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref());
        self.matching(
            deployment.metadata.namespace.as_deref(),
            labels.unwrap_or(&BTreeMap::new()),
            true,
        )
    }

    /// The leases in `namespace` selecting pods labelled `labels` (only the
    /// readiness-gated ones when `gated_only`).
    fn matching(
        &self,
        namespace: Option<&str>,
        labels: &BTreeMap<String, String>,
        gated_only: bool,
    ) -> Vec<ObjectRef<DistributedLease>> {
        let Some(namespace) = namespace else {
            return Vec::new();
        };
        let index = lock(&self.0);
        let mut matching: Vec<ObjectRef<DistributedLease>> = labels
            .iter()
            .flat_map(|(key, value)| index.filed_under(namespace, key, value))
            .chain(index.unfiled(namespace))
            .filter(|(_, (selector, gated))| (*gated || !gated_only) && selector.matches(labels))
            .map(|(name, _)| ObjectRef::new(name).within(namespace))
            .collect();
        // A lease requiring one label is filed once, so found once; sorted
        // for a stable order.
        matching.sort_by(|a, b| a.name.cmp(&b.name));
        matching
    }
}

/// The pod watch's cache, of what reconciles read of each pod
/// ([`CandidatePod`]), with the pods filed under every label they carry: a
/// lease's candidates are the pods under the label its selector requires,
/// not a scan of every pod.
#[derive(Clone)]
pub struct PodCache {
    store: Store<CandidatePod>,
    index: Arc<Mutex<LabelIndex<()>>>,
}

/// Fills a [`PodCache`] from the pod watch's events.
pub struct PodWriter {
    writer: Writer<CandidatePod>,
    index: Arc<Mutex<LabelIndex<()>>>,
}

/// An empty pod cache and its writer.
pub fn pod_cache() -> (PodCache, PodWriter) {
    let (store, writer) = reflector::store();
    let index = Arc::default();
    (
        PodCache {
            store,
            index: Arc::clone(&index),
        },
        PodWriter { writer, index },
    )
}

impl PodWriter {
    /// Applies one pod watch event to the store and its index.
    pub fn apply_watcher_event(&mut self, event: &watcher::Event<Pod>) {
        let candidate = |pod: &Pod| CandidatePod::from(pod);
        let event = match event {
            watcher::Event::Apply(pod) => watcher::Event::Apply(candidate(pod)),
            watcher::Event::Delete(pod) => watcher::Event::Delete(candidate(pod)),
            watcher::Event::Init => watcher::Event::Init,
            watcher::Event::InitApply(pod) => watcher::Event::InitApply(candidate(pod)),
            watcher::Event::InitDone => watcher::Event::InitDone,
        };
        self.writer.apply_watcher_event(&event);
        lock(&self.index).apply(&event, |pod| {
            let labels = pod.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            Some(((), labels))
        });
    }
}

impl PodCache {
    /// The pod watch's store.
    pub(crate) fn store(&self) -> &Store<CandidatePod> {
        &self.store
    }

    /// The pods of `namespace` that `selector` selects.
    pub(crate) fn selected(&self, namespace: &str, selector: &Selector) -> Vec<Arc<CandidatePod>> {
        let names: Vec<String> = {
            let index = lock(&self.index);
            match required_label(selector) {
                Some((key, value)) => index
                    .filed_under(namespace, &key, &value)
                    .map(|(name, ())| name.to_string())
                    .collect(),
                None => index.all(namespace).map(|(name, ())| name.to_string()).collect(),
            }
        };
        names
            .iter()
            .filter_map(|name| self.store.get(&ObjectRef::new(name).within(namespace)))
            .filter(|pod| selector.matches(&pod.labels))
            .collect()
    }
}

#[cfg(test)]
mod tests;
