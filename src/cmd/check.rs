//! `leasehold check`: what is wrong with an install, in plain words (like
//! `linkerd check`). It reads the cluster through the kubeconfig (or the
//! in-cluster account) and reports, one line each:
//!
//! * the DistributedLease CRD missing, or different from this release's;
//! * the injection webhook's configuration missing, its `caBundle` empty or
//!   not the CA in the webhook Secret (stale), its Service missing or
//!   without a ready endpoint (not reachable);
//! * RBAC the operator needs that the account running the check lacks
//!   (SelfSubjectAccessReview per rule: run it as the operator's
//!   ServiceAccount to check the operator's RBAC);
//! * a DistributedLease that is invalid or selects no pod;
//! * a ServiceAccount that candidate pods run as and that lacks the
//!   sidecar's RBAC ([`crate::sidecar::rbac::RULES`], one SubjectAccessReview
//!   per verb, in the pods' namespace);
//! * a readiness-gated lease whose Deployment's strategy stalls rollouts
//!   (the rule of [`crate::operator::rollout`], the one owner);
//! * a lease whose store the operator reports unreachable (`StoreReady=False`);
//! * a lease on `store: {kubernetes: {}}` whose candidates' ServiceAccounts
//!   lack a Lease verb the sidecar needs (SubjectAccessReview per account
//!   and verb of [`crate::sidecar::rbac::LEASES`]).
//!
//! A failed read is a finding too, never a crash. The exit status is 1 when
//! any finding is an error.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, CustomResourceExt, ResourceExt};

use super::installed::{self, Operator};
use super::{ClusterArgs, Output};
use crate::api::contract::{self, DEFAULT_IMAGE};
use crate::api::preference;
use crate::api::{DistributedLease, ValidStore, validate};
use crate::lease::{Identity, Prefer};
use crate::operator::candidate::CandidatePod;
use crate::operator::rbac::{NAMESPACED_RULES, RULES, WEBHOOK_CONFIGURATION};
use crate::operator::{reconcile, rollout};
use crate::rbac::Rule;

/// The webhook Secret unless `--webhook-secret` says otherwise (the
/// operator's own default).
pub(crate) const DEFAULT_WEBHOOK_SECRET: &str = "leasehold-webhook-tls";

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Check DistributedLeases in this namespace only (default: all namespaces).
    #[arg(short, long, alias = "lease-namespace", env = "LEASEHOLD_CHECK_LEASE_NAMESPACE")]
    pub namespace: Option<String>,
    /// The install to check, by its Helm release (label
    /// app.kubernetes.io/instance) [default: the one operator Deployment
    /// labelled app.kubernetes.io/name=leasehold].
    #[arg(long, env = "LEASEHOLD_CHECK_INSTANCE")]
    pub instance: Option<String>,
    /// Namespace the operator is installed in (its webhook Secret and Lease)
    /// [default: its Deployment's, else leasehold-system].
    #[arg(long, env = "LEASEHOLD_CHECK_OPERATOR_NAMESPACE")]
    pub operator_namespace: Option<String>,
    /// The injection webhook's MutatingWebhookConfiguration [default: the
    /// operator's --webhook-configuration, else leasehold-sidecar-injector].
    #[arg(long, env = "LEASEHOLD_CHECK_WEBHOOK_CONFIGURATION")]
    pub webhook_configuration: Option<String>,
    /// The Secret holding the webhook's CA (`ca.crt`) [default: the
    /// operator's --webhook-secret, else leasehold-webhook-tls].
    #[arg(long, env = "LEASEHOLD_CHECK_WEBHOOK_SECRET")]
    pub webhook_secret: Option<String>,
    /// Output format: one line per finding, or the findings as JSON or YAML
    /// (a list of {severity, message}).
    #[arg(short, long, env = "LEASEHOLD_CHECK_OUTPUT", value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// The names of the install being checked: from the flags, else from its
/// operator Deployment (found by its labels, whatever the release is
/// called), else the defaults of a release called `leasehold`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Install {
    pub namespace: String,
    pub webhook_configuration: String,
    pub webhook_secret: String,
}

impl Install {
    pub(crate) fn of(args: &Args, operator: Option<&Operator>) -> Self {
        let setting = |flag: &Option<String>, id: &str, default: &str| {
            flag.clone()
                .or_else(|| operator.and_then(|o| operator_setting(o, id)))
                .unwrap_or_else(|| default.to_string())
        };
        Install {
            namespace: args
                .operator_namespace
                .clone()
                .or_else(|| operator.map(|o| o.namespace.clone()))
                .unwrap_or_else(|| DEFAULT_OPERATOR_NAMESPACE.to_string()),
            webhook_configuration: setting(
                &args.webhook_configuration,
                "webhook_configuration",
                WEBHOOK_CONFIGURATION,
            ),
            webhook_secret: setting(&args.webhook_secret, "webhook_secret", DEFAULT_WEBHOOK_SECRET),
        }
    }
}

/// Where the chart installs by default (README).
pub(crate) const DEFAULT_OPERATOR_NAMESPACE: &str = "leasehold-system";

/// The value the operator Deployment sets for the operator flag `id`, read
/// from its container's environment under that flag's variable (the
/// operator's command line owns the variable's name).
fn operator_setting(operator: &Operator, id: &str) -> Option<String> {
    use clap::CommandFactory;
    let command = super::Cli::command();
    let env = command
        .find_subcommand("operator")?
        .get_arguments()
        .find(|arg| arg.get_id() == id)?
        .get_env()?
        .to_str()?
        .to_string();
    operator.env.get(&env).cloned()
}

/// The operator Deployment of the install: the one found by its labels (of
/// `--instance` when given), reported; `None` when there is none or more
/// than one to choose from.
async fn find_operator(client: &Client, args: &Args, report: &mut Report) -> Option<Operator> {
    let namespace = args.operator_namespace.as_deref();
    let instance = args.instance.as_deref();
    let selector = installed::selector(instance);
    match installed::operators(client, namespace, instance).await {
        Ok(found) => match found.as_slice() {
            // A release asked for by name that is not there is an error,
            // not a guess at another.
            [] if instance.is_some() => {
                report.error(format!(
                    "no operator Deployment of release {} (labelled {selector}){}: is it installed? \
                     (`helm list -A` lists releases)",
                    instance.unwrap_or_default(),
                    namespace.map(|ns| format!(" in namespace {ns}")).unwrap_or_default()
                ));
                None
            }
            [] => {
                report.warn(format!(
                    "no operator Deployment labelled {selector}: checking the names of a release called \
                     leasehold (set --instance or --operator-namespace for another)"
                ));
                None
            }
            [operator] => {
                report.ok(format!(
                    "operator {} (release {}, image {})",
                    operator.id(),
                    operator.instance.as_deref().unwrap_or("?"),
                    operator.image.as_deref().unwrap_or("?")
                ));
                check_operator_images(client, operator, report).await;
                Some(operator.clone())
            }
            several => {
                let ids: Vec<String> = several
                    .iter()
                    .map(|o| format!("{} (release {})", o.id(), o.instance.as_deref().unwrap_or("?")))
                    .collect();
                report.error(format!(
                    "{} operator Deployments: {}; pick one with --instance <release>",
                    several.len(),
                    ids.join(", ")
                ));
                None
            }
        },
        Err(e) => {
            report.warn(format!(
                "cannot list Deployments labelled {selector}: {}; checking the names of a release called leasehold",
                crate::api::errors::chain(&e)
            ));
            None
        }
    }
}

/// Container states in which the kubelet cannot get the image (kubelet's
/// `images.ErrImagePull`, `ImagePullBackOff`, `ErrInvalidImageName`:
/// pkg/kubelet/images/types.go).
const IMAGE_PULL_FAILURES: &[&str] = &["ErrImagePull", "ImagePullBackOff", "InvalidImageName"];

/// The operator's pods that cannot pull their image, reported with what to
/// do: the chart's default image is not published (README, step 1).
async fn check_operator_images(client: &Client, operator: &Operator, report: &mut Report) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &operator.namespace);
    let selector = installed::selector(operator.instance.as_deref());
    match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list
            .items
            .iter()
            .flat_map(image_pull_failures)
            .for_each(|e| report.error(e)),
        Err(e) => report.warn(format!(
            "cannot list the operator's pods ({selector}) in {}: {}",
            operator.namespace,
            crate::api::errors::chain(&e)
        )),
    }
}

/// One finding per container of `pod` whose image the kubelet cannot pull.
fn image_pull_failures(pod: &Pod) -> Vec<String> {
    let default_repository = DEFAULT_IMAGE.rsplit_once(':').map_or(DEFAULT_IMAGE, |(r, _)| r);
    let statuses = pod
        .status
        .iter()
        .flat_map(|s| (s.init_container_statuses.iter().flatten()).chain(s.container_statuses.iter().flatten()));
    statuses
        .filter_map(|status| {
            let reason = status.state.as_ref()?.waiting.as_ref()?.reason.as_deref()?;
            IMAGE_PULL_FAILURES.contains(&reason).then(|| {
                let hint = if status.image.starts_with(default_repository) {
                    format!(
                        "; {default_repository} is not published: build the image from the Dockerfile, make it \
                         available to the cluster and install with --set image.repository=…,image.tag=… \
                         (README, step 1)"
                    )
                } else {
                    "; check the image name and the registry's credentials (imagePullSecrets)".to_string()
                };
                format!(
                    "operator pod {}/{} cannot pull image {} ({reason}){hint}",
                    pod.namespace().unwrap_or_default(),
                    pod.name_any(),
                    status.image
                )
            })
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error(transparent)]
    Client(#[from] crate::api::client::ClientError),
    #[error("{0} problem(s) found")]
    Problems(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Severity {
    Ok,
    Warning,
    Error,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Finding {
    pub severity: Severity,
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = match self.severity {
            Severity::Ok => "[ok]   ",
            Severity::Warning => "[warn] ",
            Severity::Error => "[error]",
        };
        write!(f, "{mark} {}", self.message)
    }
}

/// The findings, in the order of the checks.
#[derive(Debug, Default)]
pub(crate) struct Report(pub Vec<Finding>);

impl Report {
    fn ok(&mut self, message: impl Into<String>) {
        self.push(Severity::Ok, message);
    }
    fn warn(&mut self, message: impl Into<String>) {
        self.push(Severity::Warning, message);
    }
    fn error(&mut self, message: impl Into<String>) {
        self.push(Severity::Error, message);
    }
    fn push(&mut self, severity: Severity, message: impl Into<String>) {
        self.0.push(Finding {
            severity,
            message: message.into(),
        });
    }

    pub(crate) fn errors(&self) -> usize {
        self.0.iter().filter(|f| f.severity == Severity::Error).count()
    }
}

pub(crate) async fn run(args: Args) -> Result<(), Error> {
    let client = args.cluster.client().await?;
    let report = check(client, &args).await;
    match args.output {
        Output::Table => report.0.iter().for_each(|finding| println!("{finding}")),
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&report.0).expect("findings serialize")
        ),
        Output::Yaml => print!("{}", serde_yaml::to_string(&report.0).expect("findings serialize")),
    }
    match report.errors() {
        0 => Ok(()),
        n => Err(Error::Problems(n)),
    }
}

/// Runs every check against the cluster `client` talks to.
pub(crate) async fn check(client: Client, args: &Args) -> Report {
    let mut report = Report::default();
    let crd_installed = check_crd(&client, &mut report).await;
    let operator = find_operator(&client, args, &mut report).await;
    let install = Install::of(args, operator.as_ref());
    check_webhook(&client, &install, &mut report).await;
    check_rbac(&client, &install, &mut report).await;
    if crd_installed {
        // The cluster's name as the operator has it (the chart's
        // clusterName): what the holders of this cluster carry.
        let cluster = operator.as_ref().and_then(|o| operator_setting(o, "cluster_name"));
        check_leases(&client, args, cluster.as_deref(), &mut report).await;
    }
    report
}

/// Whether the CRD is installed (in any version).
async fn check_crd(client: &Client, report: &mut Report) -> bool {
    let wanted = DistributedLease::crd();
    let name = wanted.name_any();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    match api.get_opt(&name).await {
        Ok(None) => {
            report.error(format!(
                "CRD {name} is not installed: install the chart or apply crds/distributedlease.yaml"
            ));
            false
        }
        // A deleted CRD stays until every DistributedLease is gone (their
        // finalizers first): leases can no longer be created meanwhile.
        Ok(Some(installed)) if installed.metadata.deletion_timestamp.is_some() => {
            report.error(format!(
                "CRD {name} is being deleted (it goes once every DistributedLease is gone): re-apply \
                 crds/distributedlease.yaml once it is, or leases cannot be created"
            ));
            true
        }
        Ok(Some(installed)) => {
            let schema = |crd: &CustomResourceDefinition| serde_json::to_value(&crd.spec.versions).ok();
            if schema(&installed) == schema(&wanted) {
                report.ok(format!("CRD {name} is installed and matches this leasehold"));
            } else {
                report.error(format!(
                    "CRD {name} differs from this leasehold's (an older or newer release): apply this release's \
                     crds/distributedlease.yaml (Helm does not upgrade CRDs)"
                ));
            }
            true
        }
        Err(e) => {
            report.error(format!("cannot read CRD {name}: {}", crate::api::errors::chain(&e)));
            false
        }
    }
}

async fn check_webhook(client: &Client, install: &Install, report: &mut Report) {
    let name = &install.webhook_configuration;
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let configuration = match api.get_opt(name).await {
        Ok(Some(configuration)) => configuration,
        Ok(None) => {
            report.warn(format!(
                "webhook configuration {name} is missing: pods are not injected (install the chart with \
                 webhook.enabled, or add sidecars with `leasehold inject`)"
            ));
            return;
        }
        Err(e) => {
            report.error(format!(
                "cannot read webhook configuration {name}: {}",
                crate::api::errors::chain(&e)
            ));
            return;
        }
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &install.namespace);
    let ca = match secrets.get_opt(&install.webhook_secret).await {
        Ok(secret) => secret.and_then(|s| s.data?.get("ca.crt").map(|ca| ca.0.clone())),
        Err(e) => {
            report.warn(format!(
                "cannot read Secret {}/{} to compare the webhook CA: {}",
                install.namespace,
                install.webhook_secret,
                crate::api::errors::chain(&e)
            ));
            None
        }
    };
    let webhooks = configuration.webhooks.unwrap_or_default();
    if webhooks.is_empty() {
        report.error(format!("webhook configuration {name} has no webhooks"));
    }
    for webhook in webhooks {
        let client_config = &webhook.client_config;
        let bundle = client_config
            .ca_bundle
            .as_ref()
            .map(|b| b.0.as_slice())
            .unwrap_or_default();
        if bundle.is_empty() {
            report.error(format!(
                "webhook {}: caBundle is empty, so the API server cannot call it (is the operator running? with \
                 cert-manager, is its cainjector?)",
                webhook.name
            ));
        } else if ca.as_ref().is_some_and(|ca| ca.as_slice() != bundle) {
            report.error(format!(
                "webhook {}: caBundle is stale: it is not the CA in Secret {}/{} (restart the operator, or check \
                 cert-manager's cainjector)",
                webhook.name, install.namespace, install.webhook_secret
            ));
        } else {
            report.ok(format!("webhook {}: caBundle is set", webhook.name));
        }
        let Some(service) = &client_config.service else {
            continue;
        };
        let services: Api<Service> = Api::namespaced(client.clone(), &service.namespace);
        match services.get_opt(&service.name).await {
            Ok(Some(_)) => check_endpoints(client, &webhook.name, &service.namespace, &service.name, report).await,
            Ok(None) => report.error(format!(
                "webhook {}: Service {}/{} is missing, so admission requests cannot reach the operator",
                webhook.name, service.namespace, service.name
            )),
            Err(e) => report.error(format!(
                "cannot read Service {}/{}: {}",
                service.namespace,
                service.name,
                crate::api::errors::chain(&e)
            )),
        }
    }
}

/// Whether some ready pod serves the webhook's Service, from its
/// EndpointSlices (`kubernetes.io/service-name` label).
async fn check_endpoints(client: &Client, webhook: &str, namespace: &str, service: &str, report: &mut Report) {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let selector = format!("kubernetes.io/service-name={service}");
    match slices.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => {
            let ready = list
                .items
                .iter()
                .flat_map(|slice| slice.endpoints.iter().flatten())
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
                .count();
            if ready == 0 {
                report.error(format!(
                    "webhook {webhook}: no ready pod serves Service {namespace}/{service}, so the webhook is not \
                     reachable (is the operator running?)"
                ));
            } else {
                report.ok(format!(
                    "webhook {webhook}: Service {namespace}/{service} has {ready} ready endpoint(s)"
                ));
            }
        }
        Err(e) => report.error(format!(
            "cannot read the endpoints of Service {namespace}/{service}: {}",
            crate::api::errors::chain(&e)
        )),
    }
}

/// What RBAC is asked about for each verb of each rule: the review's
/// attributes (in `namespace` unless cluster-wide) and how a report names it.
fn permissions<'a>(rules: impl IntoIterator<Item = (&'a Rule, Option<&'a str>)>) -> Vec<(ResourceAttributes, String)> {
    let mut permissions = Vec::new();
    for (rule, namespace) in rules {
        for resource in rule.resources {
            let (resource, subresource) = match resource.split_once('/') {
                Some((resource, sub)) => (resource, Some(sub.to_string())),
                None => (*resource, None),
            };
            for verb in rule.verbs {
                let attributes = ResourceAttributes {
                    group: Some(rule.api_group.to_string()),
                    resource: Some(resource.to_string()),
                    subresource: subresource.clone(),
                    verb: Some(verb.to_string()),
                    namespace: namespace.map(str::to_string),
                    name: rule.resource_names.first().map(|n| n.to_string()),
                    ..ResourceAttributes::default()
                };
                let group = match rule.api_group {
                    "" => String::new(),
                    group => format!("{group}/"),
                };
                let subresource = subresource.as_ref().map(|s| format!("/{s}")).unwrap_or_default();
                permissions.push((attributes, format!("{verb} {group}{resource}{subresource}")));
            }
        }
    }
    permissions
}

/// One SelfSubjectAccessReview per verb of every operator rule.
async fn check_rbac(client: &Client, install: &Install, report: &mut Report) {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut missing = Vec::new();
    let scoped = RULES
        .iter()
        .map(|r| (r, None))
        .chain(NAMESPACED_RULES.iter().map(|r| (r, Some(install.namespace.as_str()))));
    for (attributes, what) in permissions(scoped) {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(attributes),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        match reviews.create(&PostParams::default(), &review).await {
            Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => missing.push(what),
            Err(e) => {
                report.error(format!(
                    "cannot review RBAC (SelfSubjectAccessReview): {}",
                    crate::api::errors::chain(&e)
                ));
                return;
            }
        }
    }
    if missing.is_empty() {
        report.ok("this account has every permission the operator needs (see docs/rbac-operator.md)");
    } else {
        report.error(format!(
            "this account lacks permissions the operator needs: {} (see docs/rbac-operator.md; run the check as \
             the operator's ServiceAccount to check the operator itself)",
            missing.join(", ")
        ));
    }
}

/// The ServiceAccount a pod runs as (the API server sets `default` when
/// the spec names none; a pod read back always has it, this covers one
/// that does not).
fn service_account(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into())
}

/// One SubjectAccessReview per verb of every sidecar rule, for each
/// ServiceAccount candidate pods run as (namespace -> account -> the
/// leases whose candidates use it). The review names the account as the
/// API server authenticates its tokens: the user and its groups.
async fn check_sidecar_rbac(
    client: &Client,
    accounts: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    report: &mut Report,
) {
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    for (namespace, by_account) in accounts {
        for (account, leases) in by_account {
            let user = format!("system:serviceaccount:{namespace}:{account}");
            let groups = [
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{namespace}"),
                "system:authenticated",
            ];
            let mut missing = Vec::new();
            let scoped = crate::sidecar::rbac::RULES
                .iter()
                .map(|r| (r, Some(namespace.as_str())));
            for (attributes, what) in permissions(scoped) {
                let review = SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        user: Some(user.clone()),
                        groups: Some(groups.iter().map(|g| g.to_string()).collect()),
                        resource_attributes: Some(attributes),
                        ..SubjectAccessReviewSpec::default()
                    },
                    ..SubjectAccessReview::default()
                };
                match reviews.create(&PostParams::default(), &review).await {
                    Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => {}
                    Ok(_) => missing.push(what),
                    Err(e) => {
                        report.warn(format!(
                            "cannot review the sidecar's RBAC (SubjectAccessReview): {}; run the check as an \
                             account that may create subjectaccessreviews",
                            crate::api::errors::chain(&e)
                        ));
                        return;
                    }
                }
            }
            let leases = leases.iter().cloned().collect::<Vec<_>>().join(", ");
            if missing.is_empty() {
                report.ok(format!(
                    "ServiceAccount {namespace}/{account} (candidates of {leases}) has the sidecar's permissions"
                ));
            } else {
                report.error(format!(
                    "ServiceAccount {namespace}/{account}, which candidates of {leases} run as, lacks the sidecar's \
                     permissions: {}; bind the sidecar Role to it (chart: --set \
                     'sidecar.rbac.namespaces.{namespace}={{{account}}}' with the namespace's other accounts; see \
                     docs/rbac-sidecar.md)",
                    missing.join(", ")
                ));
            }
        }
    }
}

async fn check_leases(client: &Client, args: &Args, cluster: Option<&str>, report: &mut Report) {
    let api: Api<DistributedLease> = match &args.namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let leases = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) => {
            report.error(format!(
                "cannot list DistributedLeases: {}",
                crate::api::errors::chain(&e)
            ));
            return;
        }
    };
    if leases.is_empty() {
        report.ok("no DistributedLeases yet");
    }
    let mut accounts: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for lease in leases {
        let namespace = lease.namespace().unwrap_or_default();
        for candidate in check_lease(client, &lease, cluster, report).await {
            (accounts.entry(namespace.clone()).or_default())
                .entry(service_account(&candidate))
                .or_default()
                .insert(format!("{namespace}/{}", lease.name_any()));
        }
    }
    check_sidecar_rbac(client, &accounts, report).await;
}

/// The lease's findings; returns its candidate pods.
async fn check_lease(
    client: &Client,
    lease: &DistributedLease,
    cluster: Option<&str>,
    report: &mut Report,
) -> Vec<Arc<Pod>> {
    let namespace = lease.namespace().unwrap_or_default();
    let id = format!("DistributedLease {namespace}/{}", lease.name_any());
    let valid = match validate(lease) {
        Ok(valid) => valid,
        Err(e) => {
            report.error(format!("{id} is invalid: {}", crate::api::errors::chain(&e)));
            return Vec::new();
        }
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let selector = valid.selector.to_string();
    let pods = match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list.items.into_iter().map(Arc::new).collect::<Vec<_>>(),
        Err(e) => {
            report.error(format!("{id}: cannot list its pods: {}", crate::api::errors::chain(&e)));
            return Vec::new();
        }
    };
    let mut healthy = true;
    // What the operator reads of each pod, for the checks it shares.
    let candidates: Vec<Arc<CandidatePod>> = pods.iter().map(|pod| Arc::new(CandidatePod::from(&**pod))).collect();
    for warning in sharing_warnings(lease, &valid.store, cluster, &pods) {
        healthy = false;
        report.warn(format!("{id}: {warning}"));
    }
    for warning in preference_warnings(&valid.preference.zones, &candidates) {
        healthy = false;
        report.warn(format!("{id}: {warning}"));
    }
    let without_sidecar = reconcile::without_sidecar(&candidates);
    if !without_sidecar.is_empty() {
        healthy = false;
        report.warn(format!(
            "{id}: candidate(s) without a leasehold sidecar never campaign: {} (created while the \
             webhook was down or before the namespace opted in: delete them so they are recreated \
             with it, or add it with `leasehold inject`)",
            without_sidecar.join(", ")
        ));
    }
    if candidates.is_empty() {
        healthy = false;
        report.warn(format!(
            "{id} has no candidates: no pod in {namespace} matches the selector {selector}"
        ));
    }
    if valid.readiness_gate {
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
        match owners(&deployments, &candidates).await {
            Ok(owners) => {
                for reason in rollout::stall_reasons(&owners, rollout::leader_moves_to_new(&valid)) {
                    healthy = false;
                    report.warn(format!("{id} (readiness gate): {reason}"));
                }
                let lease_name = lease.name_any();
                for warning in owners.iter().filter_map(|d| rollout::deadline_warning(d, &lease_name)) {
                    report.warn(format!("{id} (readiness gate): {warning}"));
                }
            }
            Err(e) => report.warn(format!(
                "{id}: cannot read its Deployments: {}",
                crate::api::errors::chain(&e)
            )),
        }
    }
    let conditions = lease
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    if let Some(store) = conditions
        .iter()
        .find(|c| c.type_ == "StoreReady" && c.status == "False")
    {
        healthy = false;
        report.error(format!(
            "{id}: its store is not usable ({}): {}",
            store.reason, store.message
        ));
    }
    if healthy {
        report.ok(format!("{id}: {} candidate(s)", candidates.len()));
    }
    pods
}

/// The Deployments owning `pods`, as they are now (one GET each); the
/// operator reads them from its watch ([`rollout::cached_owners`]).
async fn owners(deployments: &Api<Deployment>, pods: &[Arc<CandidatePod>]) -> Result<Vec<Deployment>, kube::Error> {
    let mut found = Vec::new();
    for name in rollout::owning_deployments(pods) {
        found.extend(deployments.get_opt(&name).await?);
    }
    Ok(found)
}

/// What can go wrong when clusters share a lock (docs/multi-cluster.md):
/// a lock name on the Kubernetes store (each cluster has its own Lease, so
/// one leader per cluster, not one in all); a lock meant to be shared from
/// a cluster without a name (its holders cannot be told from another
/// cluster's, so the operator never releases them and status cannot say
/// where the leader runs); a lock that may be shared ordered by revisions
/// that count per cluster (a ReplicaSet's); and a holder that carries this
/// cluster's name but is none of its candidates (another cluster uses the
/// same name).
fn sharing_warnings(
    lease: &DistributedLease,
    store: &ValidStore,
    cluster: Option<&str>,
    candidates: &[Arc<Pod>],
) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(lock) = &lease.spec.lock_name {
        if matches!(store, ValidStore::Kubernetes) {
            warnings.push(format!(
                "spec.lockName {lock:?} on the Kubernetes store names a Lease in this cluster only: \
                 every cluster naming it elects a leader of its own; share a lock across clusters \
                 through store.spanner, store.postgres or store.redis"
            ));
        } else if cluster.is_none() {
            warnings.push(format!(
                "spec.lockName {lock:?} may be shared with other clusters, but this cluster has no name: \
                 set the chart's clusterName (a name unique among the clusters sharing the store) so \
                 holders say where they run"
            ));
        }
        let leadership = &lease.spec.leadership;
        let by_replica_set: Vec<&str> = candidates
            .iter()
            .filter(|pod| contract::literal_env(pod, contract::ENV_REVISION).is_none())
            .filter_map(|pod| pod.metadata.name.as_deref())
            .collect();
        if !matches!(store, ValidStore::Kubernetes)
            && (leadership.prefer != Prefer::None || leadership.version_fence)
            && !by_replica_set.is_empty()
        {
            warnings.push(format!(
                "spec.lockName {lock:?} may be shared with other clusters, and the lease orders candidates \
                 by revision (prefer {:?}, versionFence {}), but {} take theirs from their ReplicaSet, whose \
                 number counts in this cluster only: another cluster's candidates of the same code have \
                 unrelated numbers (behind the fence they may never lead). Set {} (and {}) in the pod \
                 template from your release number, the same in every cluster (docs/multi-cluster.md)",
                leadership.prefer,
                leadership.version_fence,
                by_replica_set.join(", "),
                contract::ENV_REVISION,
                contract::ENV_VERSION
            ));
        }
    }
    let holder = lease.status.as_ref().and_then(|s| s.holder.as_deref());
    if let (Some(ours), Some((text, holder))) = (cluster, holder.and_then(|h| Some((h, h.parse::<Identity>().ok()?)))) {
        let names_us = holder.cluster() == Some(ours)
            && holder
                .namespace()
                .is_none_or(|ns| Some(ns) == lease.namespace().as_deref());
        let pod_uid = Identity::pod_uid_of(text);
        let is_a_candidate = candidates.iter().any(|pod| {
            pod.metadata.name.as_deref() == Some(holder.name())
                && pod_uid
                    .as_deref()
                    .is_none_or(|uid| pod.metadata.uid.as_deref() == Some(uid))
        });
        if names_us && !is_a_candidate {
            warnings.push(format!(
                "the holder {holder} names this cluster ({ours}) but is none of its candidate pods: \
                 if this lasts longer than the lease duration, another cluster sharing the store \
                 uses the name {ours} too (cluster names must be unique)"
            ));
        }
    }
    warnings
}

/// Preferences no candidate can satisfy (docs/design.md, "Preferred
/// candidates"): a priority that does not parse (that pod is never a
/// target, and as leader is never moved), and `preferZones` with no
/// candidate in any of them.
fn preference_warnings(zones: &[String], candidates: &[Arc<CandidatePod>]) -> Vec<String> {
    let mut warnings: Vec<String> = candidates
        .iter()
        .filter_map(|pod| pod.priority.clone().err())
        .map(|e| format!("{e}: such a candidate is never preferred; set an integer"))
        .collect();
    let in_preferred_zone = |pod: &Arc<CandidatePod>| pod.zone().is_some_and(|zone| zones.iter().any(|z| z == zone));
    if !zones.is_empty() && !candidates.is_empty() && !candidates.iter().any(in_preferred_zone) {
        let seen: BTreeSet<&str> = candidates.iter().map(|pod| pod.zone().unwrap_or("none")).collect();
        warnings.push(format!(
            "spec.preferZones ({}) matches no candidate: their {} labels are {}; without the \
             PodTopologyLabels admission plugin (Kubernetes 1.35+, on by default) pods carry no zone: \
             enable it or set the label in the pod template",
            zones.join(", "),
            preference::ZONE_LABEL,
            seen.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    warnings
}

#[cfg(test)]
mod tests;
