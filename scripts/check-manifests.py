#!/usr/bin/env python3
"""Checks the install files without a cluster.

1. Every YAML file in crds/, manifests/ and the chart's static parts parses.
2. Every object in manifests/ validates against the Kubernetes schemas
   (kubernetes-validate, strict: unknown fields fail); DistributedLease
   objects against the CRD's own openAPIV3Schema.
3. The chart's values.yaml validates against values.schema.json, and every
   `.Values.x.y` a template uses exists in values.yaml.
4. The Dockerfile is multi-stage, runs as a numeric non-root USER, fetches
   nothing by ADD.
5. Every pod spec (manifests, the rendered chart, `leasehold inject` output)
   can start as non-root: the kubelet verifies runAsNonRoot only against a
   numeric user, so runAsNonRoot needs a numeric, non-zero runAsUser; our own
   image runs as 65532:65532.
6. Real Helm (helm-python-sdk, Helm v4's Go SDK): lint, validate_schema and
   render, with default values and with every optional part on; the rendered
   objects pass step 2 and step 5.
7. The injection webhook is opt-in: its selectors, as the API server reads
   them, call it for labelled namespaces or pods only, once, never in
   kube-system or the release namespace.
8. The sidecar's and the fencing ValidatingAdmissionPolicy, rendered by Helm,
   evaluated with cel-python on requests they must allow and requests they
   must deny (the real API server evaluates the fencing one in the e2e suite).
9. The checks themselves work: planted bugs must fail each check.
Files given as arguments (e.g. `leasehold inject` output) get steps 2 and 5,
and their leasehold sidecars must be native (init containers, restartPolicy
Always); a container wrapped with `leasehold run` needs the leasehold-install
init container (not restarting) and its volume instead.
Prints one line per problem and exits 1 when there is any.
"""
import copy
import pathlib
import re
import shutil
import sys
import tempfile

import celpy
import helm_python
import jsonschema
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
K8S_VERSION = "1.33.0"
CHART = ROOT / "charts" / "leasehold"
RELEASE, RELEASE_NAMESPACE = "lh", "leasehold-system"
OUR_IMAGE = "ghcr.io/leasehold/leasehold"
SIDECAR_USER = 65532
# Kinds of other projects' CRDs that kubernetes-validate has no schema for.
MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
FOREIGN_KINDS = {("cert-manager.io/v1", "Certificate")} | {("monitoring.coreos.com/v1", k) for k in MONITORING_KINDS}
# Prometheus's own files (alerting rules), not Kubernetes objects: checked by
# `promtool test rules` in tests/install/monitoring.rs.
PROMETHEUS_FILES = ROOT / "manifests" / "prometheus"
CHART_RULES = CHART / "files" / "leasehold-rules.yaml"
CHART_DASHBOARD = CHART / "files" / "leasehold-dashboard.json"
# Every optional part of the chart turned on.
DIGEST = "sha256:" + "ab" * 32
ALL_ON = {
    "global": {"imageRegistry": "registry.example.com"},
    "image": {"digest": DIGEST},
    "imagePullSecrets": [{"name": "regcred"}],
    "operator": {"priorityClassName": "system-cluster-critical"},
    "webhook": {"enabled": True, "certManager": {"enabled": True, "issuerName": "my-issuer", "issuerKind": "ClusterIssuer"}},
    "sidecar": {"mode": "container", "rbac": {"namespaces": {"my-app": ["scheduler"], "batch": ["consumer", "default"]}},
                "admissionPolicy": {"enabled": True, "required": True},
                "resources": {"requests": {"cpu": "50m", "memory": "40Mi"}, "limits": {"memory": "80Mi"}}},
    "fencing": {"enabled": True},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                "podMonitor": {"enabled": True, "labels": {"release": "kps"}},
                "prometheusRule": {"enabled": True, "labels": {"release": "kps"}},
                "grafanaDashboard": {"enabled": True}},
    "podDisruptionBudget": {"enabled": True},
}
problems = []


def load_all(path):
    try:
        return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as e:
        problems.append(f"{path.relative_to(ROOT)}: does not parse: {e}")
        return []


def crd_schemas():
    schemas = {}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        for crd in load_all(path):
            for version in crd["spec"]["versions"]:
                key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def validate(doc, where, schemas):
    """Returns the error text, or None when the object is valid."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in schemas:
        try:
            jsonschema.validate({k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}, schemas[key])
        except jsonschema.ValidationError as e:
            return f"{where}: {key[1]} {doc['metadata'].get('name')}: {e.message}"
        return None
    if key in FOREIGN_KINDS:
        return None
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"{where}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}: {e.message} at {'/'.join(map(str, e.path))}"
    except kubernetes_validate.SchemaNotFoundError:
        return f"{where}: no schema for {key}"
    return None


def check_manifests(schemas):
    files = sorted(p for p in (ROOT / "manifests").rglob("*.yaml") if PROMETHEUS_FILES not in p.parents)
    if not files:
        problems.append("manifests/: no YAML files")
    count = 0
    for path in files:
        for doc in load_all(path):
            count += 1
            error = validate(doc, path.relative_to(ROOT), schemas)
            if error:
                problems.append(error)
            problems.extend(non_root_problems(doc, path.relative_to(ROOT)))
    return count


def check_validator_catches_errors(schemas):
    broken = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "broken"},
        "spec": {"replicas": "three", "selector": {"matchLabels": {"a": "b"}},
                 "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i", "bogus": 1}]}}},
    }
    if validate(broken, "self-test", schemas) is None:
        problems.append("self-test: a Deployment with replicas: \"three\" passed validation; the checks check nothing")
    bad_lease = {"apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease", "metadata": {"name": "x"},
                 "spec": {"store": {"spanner": {"database": "d"}}, "selector": {}, "leaseDuration": "soon"}}
    if schemas and validate(bad_lease, "self-test", schemas) is None:
        problems.append("self-test: a DistributedLease with leaseDuration: soon passed validation")


def check_chart():
    chart = ROOT / "charts" / "leasehold"
    for path in [chart / "Chart.yaml", chart / "values.yaml", *sorted((chart / "crds").glob("*.yaml"))]:
        load_all(path)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    schema = yaml.safe_load((chart / "values.schema.json").read_text())
    try:
        jsonschema.Draft7Validator.check_schema(schema)
        jsonschema.validate(values, schema, cls=jsonschema.Draft7Validator)
    except (jsonschema.ValidationError, jsonschema.SchemaError) as e:
        problems.append(f"charts/leasehold/values.yaml: {e.message}")
    for template in sorted(p for p in (chart / "templates").rglob("*") if p.is_file()):
        for path in re.findall(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text()):
            node = values
            for part in path.split("."):
                if not isinstance(node, dict) or part not in node:
                    problems.append(f"{template.relative_to(ROOT)}: .Values.{path} is not in values.yaml")
                    break
                node = node[part]


def check_dockerfile():
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+\S+", text, re.M)
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    if len(stages) < 2:
        problems.append("Dockerfile: not multi-stage")
    # Every image (the full one and the `sidecar` target) runs as the same numeric user.
    if len(set(users)) > 1:
        problems.append(f"Dockerfile: the images run as different users {users}")
    if not users or not re.fullmatch(r"[1-9][0-9]*:[0-9]+", users[-1]):
        problems.append("Dockerfile: the final stage must run as a numeric non-root USER uid:gid "
                        "(the kubelet cannot verify runAsNonRoot for a user name)")
    elif users[-1] != f"{SIDECAR_USER}:{SIDECAR_USER}":
        problems.append(f"Dockerfile: USER {users[-1]}, but the pod specs run it as {SIDECAR_USER}:{SIDECAR_USER}")
    if re.search(r"^ADD\s+https?://", text, re.M):
        problems.append("Dockerfile: ADD of a remote URL")

# --- non-root ---------------------------------------------------------------

TEMPLATE_PATHS = {
    "Pod": (),
    "Deployment": ("spec", "template"), "StatefulSet": ("spec", "template"), "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"), "Job": ("spec", "template"), "ReplicationController": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


def pod_specs(doc):
    """The pod specs in an object (a List's items too)."""
    if doc.get("kind") == "List":
        for item in doc.get("items") or []:
            yield from pod_specs(item)
        return
    path = TEMPLATE_PATHS.get(doc.get("kind"))
    if path is None:
        return
    node = doc
    for part in path:
        node = (node or {}).get(part)
    if node and node.get("spec"):
        yield node["spec"]


def non_root_problems(doc, where):
    """Containers the kubelet would refuse or run as root."""
    found = []
    name = f"{where}: {doc.get('kind')} {(doc.get('metadata') or {}).get('name')}"
    for spec in pod_specs(doc):
        pod_sc = spec.get("securityContext") or {}
        for field in ("initContainers", "containers"):
            for container in spec.get(field) or []:
                sc = container.get("securityContext") or {}
                effective = {k: sc.get(k, pod_sc.get(k)) for k in ("runAsNonRoot", "runAsUser", "runAsGroup")}
                user = effective["runAsUser"]
                what = f"{name}: container {container.get('name')}"
                if user == 0:
                    found.append(f"{what}: runAsUser 0 is root")
                if effective["runAsNonRoot"] and not (isinstance(user, int) and user > 0):
                    found.append(f"{what}: runAsNonRoot without a numeric runAsUser: the kubelet cannot verify "
                                 "a non-numeric image user and refuses to start it (CreateContainerConfigError)")
                if str(container.get("image", "")).startswith(OUR_IMAGE):
                    want = {"runAsNonRoot": True, "runAsUser": SIDECAR_USER, "runAsGroup": SIDECAR_USER}
                    if effective != want:
                        found.append(f"{what}: leasehold's image must run with {want}, has {effective}")
    return found


RUNNER = "/leasehold/bin/leasehold"


def wrapped_run_problems(spec, what):
    """A container wrapped with `leasehold run` (leasehold.dev/run): the
    installer init container copies the binary first and then exits."""
    found = []
    wrapped = [c for c in spec.get("containers") or [] if (c.get("command") or [None])[0] == RUNNER]
    installers = [c for c in spec.get("initContainers") or [] if c.get("name") == "leasehold-install"]
    if not installers:
        found.append(f"{what}: a container runs {RUNNER} but no leasehold-install init container provides it")
    elif installers[0].get("restartPolicy") == "Always":
        found.append(f"{what}: leasehold-install has restartPolicy: Always (a sidecar that exits and restarts)")
    for container in wrapped:
        if not any(m.get("mountPath") == RUNNER.rsplit("/", 1)[0] for m in container.get("volumeMounts") or []):
            found.append(f"{what}: container {container.get('name')} runs {RUNNER} without mounting its folder")
    return found


def native_sidecar_problems(doc, where):
    """Injected leasehold sidecars must be native sidecars; a container
    wrapped with `leasehold run` needs no sidecar but the installer."""
    found = []
    for spec in pod_specs(doc):
        what = f"{where}: {doc.get('kind')} {doc['metadata'].get('name')}"
        if any((c.get("command") or [None])[0] == RUNNER for c in spec.get("containers") or []):
            found.extend(wrapped_run_problems(spec, what))
            continue
        names = [c.get("name") for c in spec.get("containers") or []]
        native = [c for c in spec.get("initContainers") or [] if c.get("name") == "leasehold"]
        if "leasehold" in names:
            found.append(f"{where}: {doc.get('kind')} {doc['metadata'].get('name')}: the sidecar is a regular container")
        elif not native:
            found.append(f"{where}: {doc.get('kind')} {doc['metadata'].get('name')}: no leasehold sidecar")
        elif native[0].get("restartPolicy") != "Always":
            found.append(f"{where}: {doc.get('kind')} {doc['metadata'].get('name')}: the sidecar init container "
                         "lacks restartPolicy: Always (it would block the app containers)")
    return found


def check_files(paths, schemas):
    """`leasehold inject` output and the like: valid, non-root, native sidecars."""
    for path in paths:
        path = pathlib.Path(path)
        docs = load_all(path)
        if not any(True for d in docs for _ in pod_specs(d)):
            problems.append(f"{path}: no pod specs")
        for doc in docs:
            error = validate(doc, path.name, schemas)
            if error:
                problems.append(error)
            problems.extend(non_root_problems(doc, path.name))
            problems.extend(native_sidecar_problems(doc, path.name))


# --- Helm -------------------------------------------------------------------

def render(values):
    """The chart rendered by Helm's Go SDK, as a list of objects."""
    return render_dir(CHART, values)


def render_dir(chart_dir, values):
    chart = helm_python.Chart.load(str(chart_dir))
    rendered = chart.render(values, name=RELEASE, namespace=RELEASE_NAMESPACE, is_install=True)
    docs = []
    for template, text in sorted(rendered.items()):
        if template.endswith(".txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d is not None)
    return docs


def check_helm(schemas):
    """Lint, schema and render with Helm itself, default values and everything on."""
    chart = helm_python.Chart.load(str(CHART))
    results = {}
    for label, values in (("default values", {}), ("every optional part on", ALL_ON)):
        report = helm_python.lint(str(CHART), values, namespace=RELEASE_NAMESPACE)
        for message in report["messages"]:
            if message["severity"] >= 3:
                problems.append(f"helm lint ({label}): {message['path']}: {message['error']}")
        problems.extend(f"helm lint ({label}): {e}" for e in report["errors"])
        try:
            chart.validate_schema(values)
        except helm_python.HelmError as e:
            problems.append(f"helm validate_schema ({label}): {e}")
        try:
            docs = render(values)
        except helm_python.HelmError as e:
            problems.append(f"helm render ({label}): {e}")
            continue
        where = f"chart ({label})"
        for doc in docs:
            error = validate(doc, where, schemas)
            if error:
                problems.append(error)
            problems.extend(non_root_problems(doc, where))
        results[label] = docs
    docs = results.get("every optional part on", [])
    kinds = {d["kind"] for d in docs}
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "Certificate", "Role",
                 "PodDisruptionBudget", "MutatingWebhookConfiguration"):
        if kind not in kinds:
            problems.append(f"chart (every optional part on): no {kind} rendered")
    # Offline rendering has no monitoring.coreos.com API: no ServiceMonitor (nor
    # PodMonitor, PrometheusRule), which the API server would reject on a
    # cluster without the Prometheus operator.
    for kind in sorted(kinds.intersection(MONITORING_KINDS)):
        problems.append(f"chart: a {kind} is rendered although the cluster has no monitoring.coreos.com/v1")
    problems.extend(dashboard_problems(docs))
    planted = copy.deepcopy(docs)
    for d in planted:
        if d["kind"] == "ConfigMap" and "leasehold.json" in d.get("data", {}):
            d["data"]["leasehold.json"] = d["data"]["leasehold.json"].replace("leasehold_is_leader", "leasehold_leader")
    if docs and not dashboard_problems(planted):
        problems.append("self-test: a dashboard ConfigMap that differs from files/leasehold-dashboard.json passed")
    roles = [d["metadata"]["name"] for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] != RELEASE_NAMESPACE]
    if roles and not all(r.startswith(RELEASE) for r in roles):
        problems.append(f"chart: sidecar Roles {roles} are not named after the release; two releases would collide")
    problems.extend(sidecar_binding_problems(docs, ALL_ON["sidecar"]["rbac"]["namespaces"]))
    check_monitoring_templates()
    # A parent chart passes `global` to its subcharts.
    try:
        chart.validate_schema({"global": {"anything": 1}})
    except helm_python.HelmError as e:
        problems.append(f"values.schema.json rejects `global`, so the chart cannot be a subchart: {e}")
    return results


def the(docs, kind):
    return next((d for d in docs if d["kind"] == kind), None)


def operator_pod(docs):
    return the(docs, "Deployment")["spec"]["template"]["spec"]


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def chart_value_problems(docs):
    """What each value people expect does to the rendered chart (ALL_ON)."""
    out = []
    pod = operator_pod(docs)
    operator = pod["containers"][0]
    if operator["image"] != f"ghcr.io/leasehold/leasehold@{DIGEST}":
        out.append(f"image.digest: the operator's image is {operator['image']}")
    if env_of(operator).get("LEASEHOLD_SIDECAR_IMAGE") != operator["image"]:
        out.append("image.digest: the injected sidecar's image is not the operator's (sidecar.image unset)")
    if pod.get("priorityClassName") != "system-cluster-critical":
        out.append("operator.priorityClassName: not on the operator's pod")
    issuer = the(docs, "Certificate")["spec"]["issuerRef"]
    if issuer != {"name": "my-issuer", "kind": "ClusterIssuer"}:
        out.append(f"webhook.certManager.issuerKind: issuerRef is {issuer}")
    sidecar = {k: env_of(operator).get(f"LEASEHOLD_SIDECAR_{k}") for k in ("CPU_REQUEST", "MEMORY_REQUEST", "MEMORY_LIMIT")}
    if sidecar != {"CPU_REQUEST": "50m", "MEMORY_REQUEST": "40Mi", "MEMORY_LIMIT": "80Mi"}:
        out.append(f"sidecar.resources: the operator injects {sidecar}")
    return out


def check_chart_values(schemas):
    """The values a Kubernetes user expects, each rendered by Helm and validated."""
    def rendered(label, values):
        try:
            docs = render(values)
        except helm_python.HelmError as e:
            problems.append(f"helm render ({label}): {e}")
            return []
        for doc in docs:
            error = validate(doc, f"chart ({label})", schemas)
            if error:
                problems.append(error)
        return docs

    docs = rendered("every optional part on", ALL_ON)
    found = chart_value_problems(docs)
    problems.extend(found)
    # The check itself: a chart ignoring priorityClassName is caught.
    planted = copy.deepcopy(docs)
    operator_pod(planted).pop("priorityClassName", None)
    if docs and not any("priorityClassName" in p for p in chart_value_problems(planted)):
        problems.append("self-test: an operator pod without its priorityClassName passed")
    # Names: <release>-<nameOverride>, or fullnameOverride; the label
    # `leasehold check` finds the install by is unchanged.
    for values, name in (({"nameOverride": "locks"}, f"{RELEASE}-locks-operator"),
                         ({"fullnameOverride": "shared-locks"}, "shared-locks-operator")):
        deployment = the(rendered(f"{values}", values), "Deployment")
        if deployment and deployment["metadata"]["name"] != name:
            problems.append(f"{values}: the operator Deployment is {deployment['metadata']['name']}, not {name}")
        if deployment and deployment["metadata"]["labels"].get("app.kubernetes.io/name") != "leasehold":
            problems.append(f"{values}: the operator lost its app.kubernetes.io/name=leasehold label")
    # sidecar.image names a second image (the Dockerfile's `sidecar` target)
    # for the injected sidecar only; its digest wins over its tag, its tag
    # defaults to the chart's appVersion.
    app_version = re.search(r'^appVersion:\s*"?([^"\s]+)', (CHART / "Chart.yaml").read_text(), re.M).group(1)
    for image, wanted in (({"repository": "registry.example.com/leasehold-sidecar"},
                           f"registry.example.com/leasehold-sidecar:{app_version}"),
                          ({"repository": "registry.example.com/leasehold-sidecar", "tag": "1.2.3"},
                           "registry.example.com/leasehold-sidecar:1.2.3"),
                          ({"repository": "registry.example.com/leasehold-sidecar", "tag": "1.2.3", "digest": DIGEST},
                           f"registry.example.com/leasehold-sidecar@{DIGEST}")):
        operator = operator_pod(rendered(f"sidecar.image {image}", {"sidecar": {"image": image}}))["containers"][0]
        if env_of(operator).get("LEASEHOLD_SIDECAR_IMAGE") != wanted:
            problems.append(f"sidecar.image {image}: the injected image is {env_of(operator).get('LEASEHOLD_SIDECAR_IMAGE')}, not {wanted}")
        if not operator["image"].startswith("ghcr.io/leasehold/leasehold:"):
            problems.append(f"sidecar.image {image}: the operator's image became {operator['image']}")
    # The default spread over nodes, and a list replacing it.
    default_spread = operator_pod(rendered("default values", {})).get("topologySpreadConstraints", [])
    if [c.get("topologyKey") for c in default_spread] != ["kubernetes.io/hostname"]:
        problems.append(f"operator: no default spread over nodes ({default_spread})")
    zones = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
              "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "leasehold"}}}]
    spread = operator_pod(rendered("topologySpreadConstraints", {"operator": {"topologySpreadConstraints": zones}}))
    if spread.get("topologySpreadConstraints") != zones:
        problems.append(f"operator.topologySpreadConstraints: rendered {spread.get('topologySpreadConstraints')}")
    # OpenShift: the restricted SCC assigns the uid, so the chart must let it be dropped.
    # (Helm merges a map with the defaults; null removes a key.)
    openshift = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    values = {"operator": {"podSecurityContext": {"runAsUser": None, "runAsGroup": None}}}
    pod = operator_pod(rendered("OpenShift securityContext", values))
    if pod.get("securityContext") != openshift:
        problems.append(f"operator.podSecurityContext: rendered {pod.get('securityContext')}")
    container = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    pod = operator_pod(rendered("container securityContext", {"operator": {"securityContext": container}}))
    if pod["containers"][0].get("securityContext") != container:
        problems.append(f"operator.securityContext: rendered {pod['containers'][0].get('securityContext')}")
    # One clusterName reaches the operator (which passes it to every sidecar
    # it injects); the deprecated operator.clusterName still does; two
    # different names are refused, and so is a name a holder identity
    # cannot carry.
    for values in ({"clusterName": "west"}, {"operator": {"clusterName": "west"}},
                   {"clusterName": "west", "operator": {"clusterName": "west"}}):
        operator = operator_pod(rendered(f"{values}", values))["containers"][0]
        if env_of(operator).get("LEASEHOLD_CLUSTER_NAME") != "west":
            problems.append(f"{values}: the operator's LEASEHOLD_CLUSTER_NAME is {env_of(operator).get('LEASEHOLD_CLUSTER_NAME')}")
    if "LEASEHOLD_CLUSTER_NAME" in env_of(operator_pod(rendered("default values", {}))["containers"][0]):
        problems.append("default values: the operator got a cluster name")
    try:
        render({"clusterName": "west", "operator": {"clusterName": "east"}})
        problems.append("clusterName west and operator.clusterName east: rendered, one silently winning")
    except helm_python.HelmError as e:
        if "set clusterName only" not in str(e):
            problems.append(f"clusterName west and operator.clusterName east: refused without saying why: {e}")
    for bad in ("us/west", "a#b", "a@b", "two words", "x" * 64):
        try:
            helm_python.Chart.load(str(CHART)).validate_schema({"clusterName": bad})
            problems.append(f"values.schema.json: clusterName {bad!r} was accepted")
        except helm_python.HelmError:
            pass
    # NOTES.txt names this install to `leasehold check` (which finds it by its labels).
    notes = helm_python.Chart.load(str(CHART)).render({}, name=RELEASE, namespace=RELEASE_NAMESPACE, is_install=True)
    wanted = f"leasehold check --instance {RELEASE} --operator-namespace {RELEASE_NAMESPACE}"
    if not any(wanted in text for template, text in notes.items() if template.endswith("NOTES.txt")):
        problems.append(f"NOTES.txt: does not print `{wanted}`")
    # A value the schema does not know is refused, not silently ignored.
    try:
        helm_python.Chart.load(str(CHART)).validate_schema({"image": {"digest": "latest"}})
        problems.append("values.schema.json: image.digest 'latest' (not sha256:…) was accepted")
    except helm_python.HelmError:
        pass


def dashboard_problems(docs):
    """The dashboard ConfigMap: labelled for Grafana's sidecar, holding the chart's file unchanged."""
    maps = [d for d in docs if d["kind"] == "ConfigMap" and (d["metadata"].get("labels") or {}).get("grafana_dashboard") == "1"]
    if len(maps) != 1:
        return [f"chart: {len(maps)} ConfigMaps labelled grafana_dashboard: \"1\" with the dashboard on, expected 1"]
    if list(maps[0]["data"].values()) != [CHART_DASHBOARD.read_text().rstrip("\n")]:
        return ["chart: the dashboard ConfigMap does not hold files/leasehold-dashboard.json unchanged"]
    return []


def monitoring_problems(docs):
    """The Prometheus operator's objects rendered where its API exists."""
    found = {kind: [d for d in docs if d.get("kind") == kind] for kind in MONITORING_KINDS}
    wrong = [f"{kind}: {len(objs)} rendered where the API exists, expected 1" for kind, objs in found.items() if len(objs) != 1]
    if wrong:
        return wrong
    out = []
    ports = {p.get("name") for d in docs if d.get("kind") == "Service" for p in d["spec"]["ports"]}
    if not all(e["port"] in ports for e in found["ServiceMonitor"][0]["spec"]["endpoints"]):
        out.append(f"ServiceMonitor scrapes a port no Service has ({ports})")
    if [e["port"] for e in found["PodMonitor"][0]["spec"]["podMetricsEndpoints"]] != ["lh-metrics"]:
        out.append("PodMonitor does not scrape the sidecar's lh-metrics port")
    if found["PrometheusRule"][0]["spec"] != yaml.safe_load(CHART_RULES.read_text()):
        out.append("PrometheusRule: its spec is not files/leasehold-rules.yaml")
    for kind, objs in found.items():
        if objs[0]["metadata"]["labels"].get("release") != "kps":
            out.append(f"{kind}: metrics.*.labels (release: kps, as kube-prometheus-stack selects) not on it")
    return out


def check_monitoring_templates():
    """The Go SDK renders offline without the cluster's API list (no
    --api-versions), so the ServiceMonitor, PodMonitor and PrometheusRule
    never render above; render a copy whose capability test is true, to check
    the templates themselves."""
    capability = '(.Capabilities.APIVersions.Has "monitoring.coreos.com/v1")'
    with tempfile.TemporaryDirectory() as tmp:
        copy_dir = pathlib.Path(tmp) / "leasehold"
        shutil.copytree(CHART, copy_dir)
        for name in ("servicemonitor.yaml", "podmonitor.yaml", "prometheusrule.yaml"):
            template = copy_dir / "templates" / name
            text = template.read_text()
            if capability not in text:
                problems.append(f"{name}: not guarded by the monitoring.coreos.com/v1 capability")
                return
            template.write_text(text.replace(capability, "true"))
        docs = render_dir(copy_dir, ALL_ON)
        problems.extend(monitoring_problems(docs))
        # The check itself: a rule changed in the PrometheusRule is caught.
        rule = next(d for d in docs if d.get("kind") == "PrometheusRule")
        rule["spec"]["groups"][0]["rules"][0]["expr"] += " * 2"
        if not any("PrometheusRule" in p for p in monitoring_problems(docs)):
            problems.append("self-test: a PrometheusRule whose rules differ from files/leasehold-rules.yaml passed")


def sidecar_binding_problems(docs, namespaces):
    """The sidecar Role is bound, per namespace, to exactly the ServiceAccounts
    sidecar.rbac.namespaces names for it (least privilege: no other account
    of that namespace gets it)."""
    found = []
    bound = {}
    for d in docs:
        if d["kind"] == "RoleBinding" and d["roleRef"]["name"].endswith("-sidecar"):
            bound[d["metadata"]["namespace"]] = sorted(
                (s["namespace"], s["name"]) for s in d["subjects"] if s["kind"] == "ServiceAccount")
    want = {ns: sorted((ns, sa) for sa in accounts) for ns, accounts in namespaces.items()}
    if bound != want:
        found.append(f"chart: the sidecar RoleBindings bind {bound}, expected {want}")
    return found


# --- webhook opt-in ---------------------------------------------------------

def selector_matches(selector, labels):
    """metav1.LabelSelector semantics (apimachinery labels.Selector); an empty selector matches all."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def webhook_calls(configuration, namespace, ns_labels, pod_labels):
    """How many of the configuration's webhooks the API server calls for a pod CREATE."""
    ns_labels = dict(ns_labels, **{"kubernetes.io/metadata.name": namespace})
    return sum(
        1 for w in configuration["webhooks"]
        if selector_matches(w.get("namespaceSelector"), ns_labels) and selector_matches(w.get("objectSelector"), pod_labels)
    )


def webhook_selector_problems(configuration, release_namespace, where):
    on, off = {"leasehold.dev/inject": "enabled"}, {"leasehold.dev/inject": "disabled"}
    cases = [
        ("an unlabelled pod in an unlabelled namespace", "my-app", {}, {}, 0),
        ("a labelled pod in an unlabelled namespace", "my-app", {}, on, 1),
        ("an unlabelled pod in a labelled namespace", "my-app", on, {}, 1),
        ("a labelled pod in a labelled namespace", "my-app", on, on, 1),
        ("a pod opting out in a labelled namespace", "my-app", on, off, 0),
        ("a labelled pod in a namespace opting out", "my-app", off, on, 0),
        ("a labelled pod in kube-system", "kube-system", on, on, 0),
        ("a labelled pod in the release namespace", release_namespace, on, on, 0),
    ]
    found = []
    for what, namespace, ns_labels, pod_labels, want in cases:
        got = webhook_calls(configuration, namespace, ns_labels, pod_labels)
        if got != want:
            found.append(f"{where}: {what}: the webhook is called {got} times, expected {want}")
    return found


def check_webhook_opt_in(helm_docs):
    for path in [ROOT / "manifests" / "install.yaml"]:
        for doc in load_all(path):
            if doc.get("kind") == "MutatingWebhookConfiguration":
                problems.extend(webhook_selector_problems(doc, "leasehold-system", path.relative_to(ROOT)))
    for label, docs in helm_docs.items():
        configurations = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
        if not configurations:
            problems.append(f"chart ({label}): no MutatingWebhookConfiguration")
        for doc in configurations:
            problems.extend(webhook_selector_problems(doc, RELEASE_NAMESPACE, f"chart ({label})"))


# --- the sidecar's ValidatingAdmissionPolicy ---------------------------------

def sidecar_request(username="system:serviceaccount:my-app:scheduler", pod_name="web-0", subresource=""):
    return {"username": username, "extra": {"authentication.kubernetes.io/pod-name": [pod_name]},
            "subResource": subresource}


def base_pod(name="web-0"):
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "my-app", "labels": {"app": "web", "leasehold.dev/leader": "false"},
                     "annotations": {"leasehold.dev/lease": "web"}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}], "serviceAccountName": "scheduler"},
        "status": {"phase": "Running", "podIP": "10.0.0.7",
                   "conditions": [{"type": "Ready", "status": "False"}, {"type": "leasehold.dev/leader", "status": "False"}]},
    }


def changed(mutate, name="web-0"):
    pod = base_pod(name)
    mutate(pod)
    return pod


def set_label(key, value):
    return lambda p: p["metadata"]["labels"].__setitem__(key, value)


def set_condition(kind, status):
    def mutate(pod):
        for c in pod["status"]["conditions"]:
            if c["type"] == kind:
                c["status"] = status
    return mutate


# (what, request, old pod, new pod, allowed)
POLICY_CASES = [
    ("the sidecar sets the leader label on a peer", sidecar_request(), base_pod("web-1"),
     changed(set_label("leasehold.dev/leader", "true"), "web-1"), True),
    ("the sidecar adds the leader label to a pod without labels", sidecar_request(),
     changed(lambda p: p["metadata"].pop("labels")), changed(lambda p: p["metadata"].__setitem__("labels", {"leasehold.dev/leader": "true"})), True),
    ("the sidecar sets its own leader condition", sidecar_request(subresource="status"), base_pod(),
     changed(set_condition("leasehold.dev/leader", "True")), True),
    ("the sidecar adds its first leader condition", sidecar_request(subresource="status"),
     changed(lambda p: p["status"].pop("conditions")),
     changed(lambda p: p["status"].__setitem__("conditions", [{"type": "leasehold.dev/leader", "status": "True"}])), True),
    ("someone else changes any label", sidecar_request(username="system:serviceaccount:my-app:other"), base_pod(),
     changed(set_label("app", "evil")), True),
    ("a second listed ServiceAccount changes another label", sidecar_request(username="system:serviceaccount:batch:default"),
     base_pod(), changed(set_label("app", "evil")), False),
    ("an unlisted ServiceAccount of a listed namespace changes any label",
     sidecar_request(username="system:serviceaccount:batch:other"), base_pod(), changed(set_label("app", "evil")), True),
    ("the sidecar changes another label", sidecar_request(), base_pod(), changed(set_label("app", "evil")), False),
    ("the sidecar adds another label", sidecar_request(), base_pod(), changed(set_label("tier", "x")), False),
    ("the sidecar removes another label", sidecar_request(), base_pod(),
     changed(lambda p: p["metadata"]["labels"].pop("app")), False),
    ("the sidecar changes a pod's image", sidecar_request(), base_pod(),
     changed(lambda p: p["spec"]["containers"][0].__setitem__("image", "evil:1")), False),
    ("the sidecar changes an annotation", sidecar_request(), base_pod(),
     changed(lambda p: p["metadata"]["annotations"].__setitem__("leasehold.dev/lease", "other")), False),
    ("the sidecar marks its own pod retired from a lease", sidecar_request(), base_pod(),
     changed(lambda p: p["metadata"]["annotations"].__setitem__("leasehold.dev/retired-from", "u-1")), True),
    ("the sidecar marks its own pod without annotations retired", sidecar_request(),
     changed(lambda p: p["metadata"].pop("annotations")),
     changed(lambda p: p["metadata"].__setitem__("annotations", {"leasehold.dev/retired-from": "u-1"})), True),
    ("the sidecar marks another pod retired from a lease", sidecar_request(), base_pod("web-1"),
     changed(lambda p: p["metadata"]["annotations"].__setitem__("leasehold.dev/retired-from", "u-1"), "web-1"), False),
    ("the sidecar says its own pod campaigns for a lease", sidecar_request(), base_pod(),
     changed(lambda p: p["metadata"]["annotations"].__setitem__("leasehold.dev/campaigns-for", "web")), True),
    ("the sidecar says another pod campaigns for a lease", sidecar_request(), base_pod("web-1"),
     changed(lambda p: p["metadata"]["annotations"].__setitem__("leasehold.dev/campaigns-for", "web"), "web-1"), False),
    ("the sidecar adds a finalizer", sidecar_request(), base_pod(),
     changed(lambda p: p["metadata"].__setitem__("finalizers", ["x/y"])), False),
    ("the sidecar sets another pod's leader condition", sidecar_request(subresource="status"), base_pod("web-1"),
     changed(set_condition("leasehold.dev/leader", "True"), "web-1"), False),
    ("the sidecar adds its own timing-at-risk condition", sidecar_request(subresource="status"), base_pod(),
     changed(lambda p: p["status"]["conditions"].append({"type": "leasehold.dev/timing-at-risk", "status": "True"})), True),
    ("the sidecar adds its own store-reachable condition", sidecar_request(subresource="status"), base_pod(),
     changed(lambda p: p["status"]["conditions"].append({"type": "leasehold.dev/store-reachable", "status": "True"})), True),
    ("the sidecar sets another pod's timing-at-risk condition", sidecar_request(subresource="status"), base_pod("web-1"),
     changed(lambda p: p["status"]["conditions"].append({"type": "leasehold.dev/timing-at-risk", "status": "True"}), "web-1"),
     False),
    ("the sidecar sets its own Ready condition", sidecar_request(subresource="status"), base_pod(),
     changed(set_condition("Ready", "True")), False),
    ("the sidecar changes its own phase", sidecar_request(subresource="status"), base_pod(),
     changed(lambda p: p["status"].__setitem__("phase", "Failed")), False),
    ("a token not bound to a pod writes status", dict(sidecar_request(subresource="status"), extra={}), base_pod(),
     changed(set_condition("leasehold.dev/leader", "True")), False),
]


def evaluate(expression, activation):
    env = celpy.Environment()
    try:
        result = env.program(env.compile(expression)).evaluate(celpy.json_to_cel(activation))
    except Exception as e:  # a compile or evaluation error fails the request (failurePolicy: Fail)
        return e
    return result


def policy_decision(policy, request, old, new):
    """True when the policy admits the request, as the API server decides it."""
    spec = policy["spec"]
    req = {"userInfo": {"username": request["username"], "extra": request["extra"]}, "operation": "UPDATE"}
    # The API server leaves subResource out of `request` on a write to the
    # object itself: reading it there is an error ("no such key: subResource",
    # seen on Kubernetes 1.36), which fails the request unless `||` or `&&`
    # decides without it.
    if request["subResource"]:
        req["subResource"] = request["subResource"]
    activation = {"object": new, "oldObject": old, "request": req}
    for condition in spec.get("matchConditions") or []:
        if evaluate(condition["expression"], activation) is not True and evaluate(condition["expression"], activation) != True:  # noqa: E712
            return True, "not matched"
    variables = {}
    for variable in spec.get("variables") or []:
        value = evaluate(variable["expression"], dict(activation, variables=variables))
        # The API server evaluates a variable when an expression uses it: one
        # that fails is left out, so only an expression using it fails.
        if not isinstance(value, Exception):
            # Back to Python, so json_to_cel reads a boolean as one (celpy's BoolType is an int).
            variables[variable["name"]] = bool(value) if isinstance(value, celpy.celtypes.BoolType) else value
    activation["variables"] = variables
    for validation in spec["validations"]:
        result = evaluate(validation["expression"], activation)
        if result != True:  # noqa: E712  (celpy's BoolType compares equal to True)
            return False, validation.get("message", validation["expression"])
    return True, "allowed"


def admission_policy_problems(policy, where, cases=POLICY_CASES):
    found = []
    for what, request, old, new, allowed in cases:
        got, why = policy_decision(policy, request, copy.deepcopy(old), copy.deepcopy(new))
        if got != allowed:
            found.append(f"{where}: {what}: {'allowed' if got else 'denied'} ({why}), expected "
                         f"{'allowed' if allowed else 'denied'}")
    return found


def fenced_config_map(token="42", holder="leader-b", lock="postgres:orders", extra=None, finalizers=None):
    annotations = {"leasehold.dev/fencing-token": token, "leasehold.dev/fencing-holder": holder,
                   "leasehold.dev/fencing-lock": lock}
    annotations.update(extra or {})
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "orders", "namespace": "my-app",
                               "annotations": {k: v for k, v in annotations.items() if v is not None}},
                  "data": {"owner": holder or ""}}
    if finalizers is not None:
        config_map["metadata"].update(finalizers=finalizers, deletionTimestamp="2026-01-01T00:00:00Z")
    return config_map


def writer(username, pod_name=None, subresource=""):
    return {"username": username, "extra": {"authentication.kubernetes.io/pod-name": [pod_name]} if pod_name else {},
            "subResource": subresource}


# The chart's default fencing.trustedWriters: the garbage collector with and
# without --use-service-account-credentials.
GARBAGE_COLLECTOR = "system:serviceaccount:kube-system:generic-garbage-collector"
CONTROLLER_MANAGER = "system:kube-controller-manager"

# (what, request, old object, new object, allowed): the old object holds
# token 42 from leader-b unless it says otherwise.
FENCING_CASES = [
    ("the holder writes again with its token", writer("leader-b"), fenced_config_map(), fenced_config_map(), True),
    ("the holder writes with a higher token", writer("leader-b"), fenced_config_map(), fenced_config_map("43"), True),
    ("a new holder writes with a higher token", writer("leader-c"), fenced_config_map(), fenced_config_map("43", "leader-c"), True),
    ("the holder writes with a lower token", writer("leader-b"), fenced_config_map(), fenced_config_map("41"), False),
    ("a deposed leader writes its old token", writer("leader-a"), fenced_config_map(), fenced_config_map("41", "leader-a"), False),
    ("a new holder writes an equal token", writer("leader-a"), fenced_config_map(), fenced_config_map("42", "leader-a"), False),
    ("a deposed leader leaves the annotations untouched", writer("leader-a"), fenced_config_map(),
     dict(fenced_config_map(), data={"owner": "leader-a"}), False),
    ("a writer names someone else as holder", writer("leader-a"), fenced_config_map(), fenced_config_map("43", "leader-c"), False),
    ("the token is removed", writer("leader-b"), fenced_config_map(), fenced_config_map(None), False),
    ("every annotation is removed", writer("leader-b"), fenced_config_map(),
     {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "orders"}}, False),
    ("a malformed token", writer("leader-b"), fenced_config_map(), fenced_config_map("43a"), False),
    ("a negative token", writer("leader-b"), fenced_config_map(), fenced_config_map("-43"), False),
    ("a token with a leading zero", writer("leader-b"), fenced_config_map(), fenced_config_map("043"), False),
    ("the lock changes", writer("leader-b"), fenced_config_map(), fenced_config_map("43", lock="postgres:billing"), False),
    ("the lock is removed", writer("leader-b"), fenced_config_map(), fenced_config_map("43", lock=None), False),
    ("a token is added to an object without one", writer("anyone"),
     {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "orders"}}, fenced_config_map("1", "anyone"), True),
    ("a pod writes as its pod name", writer("system:serviceaccount:my-app:scheduler", "web-1"), fenced_config_map(),
     fenced_config_map("43", "web-1"), True),
    ("a pod writes as its ServiceAccount", writer("system:serviceaccount:my-app:scheduler", "web-1"), fenced_config_map(),
     fenced_config_map("43", "system:serviceaccount:my-app:scheduler"), False),
    ("a nanosecond token above 2^53", writer("leader-c"), fenced_config_map("1764000000000000001"),
     fenced_config_map("1764000000000000002", "leader-c"), True),
    ("a nanosecond token one below", writer("leader-c"), fenced_config_map("1764000000000000001"),
     fenced_config_map("1764000000000000000", "leader-c"), False),
    # A Deployment's /status write keeps the annotations it sends.
    ("a deposed leader lowers the token through /status", writer("leader-a", subresource="status"),
     fenced_config_map(), fenced_config_map("41", "leader-a"), False),
    ("a subresource write removes the token", writer("leader-b", subresource="status"), fenced_config_map(),
     fenced_config_map(None), False),
    ("a subresource write adds a lock", writer("leader-b", subresource="status"), fenced_config_map(lock=None),
     fenced_config_map(), False),
    ("a controller writes status and another annotation", writer("system:serviceaccount:kube-system:deployment-controller",
                                                                 subresource="status"),
     fenced_config_map(), fenced_config_map(extra={"deployment.kubernetes.io/revision": "2"}), True),
    # Trusted writers finish deletes, and never move the token.
    ("the garbage collector removes foregroundDeletion", writer(GARBAGE_COLLECTOR),
     fenced_config_map(finalizers=["foregroundDeletion"]), fenced_config_map(finalizers=[]), True),
    ("the controller manager's own user removes foregroundDeletion", writer(CONTROLLER_MANAGER),
     fenced_config_map(finalizers=["foregroundDeletion", "x/y"]), fenced_config_map(finalizers=["x/y"]), True),
    ("a writer not trusted removes a finalizer", writer("system:serviceaccount:my-app:other"),
     fenced_config_map(finalizers=["x/y"]), fenced_config_map(finalizers=[]), False),
    ("a pod of a trusted writer's account removes a finalizer", writer(GARBAGE_COLLECTOR, "gc-0"),
     fenced_config_map(finalizers=["x/y"]), fenced_config_map(finalizers=[]), True),
    ("a trusted writer raises the token as holder", writer(GARBAGE_COLLECTOR), fenced_config_map(),
     fenced_config_map("43", GARBAGE_COLLECTOR), False),
    ("a trusted writer lowers the token", writer(GARBAGE_COLLECTOR), fenced_config_map(), fenced_config_map("41"), False),
    ("a trusted writer removes the token", writer(GARBAGE_COLLECTOR), fenced_config_map(), fenced_config_map(None), False),
    ("a trusted writer changes the lock", writer(GARBAGE_COLLECTOR), fenced_config_map(),
     fenced_config_map(lock="postgres:billing"), False),
]


def check_fencing_policy(docs):
    """The fencing policy decides every FENCING_CASES request as listed, and
    the check catches a policy that skips the holder binding."""
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith("-fencing")]
    if not policies:
        problems.append("chart (every optional part on): no fencing ValidatingAdmissionPolicy rendered")
        return
    policy = policies[0]
    problems.extend(admission_policy_problems(policy, "chart fencing policy", FENCING_CASES))
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"
                and d["spec"]["policyName"] == policy["metadata"]["name"]]
    if not bindings or bindings[0]["spec"].get("validationActions") != ["Deny"] or policy["spec"]["failurePolicy"] != "Fail":
        problems.append("chart: the fencing policy has no binding that denies, or does not fail closed")
    for what, planted in fencing_policy_plants(policy):
        if not admission_policy_problems(planted, "self-test", FENCING_CASES):
            problems.append(f"self-test: a fencing policy {what} passed the fencing policy check")


def fencing_policy_plants(policy):
    """Broken copies of the fencing policy, each a way a policy lets a stale
    write through: (what is wrong, policy). Each validation is dropped by the
    message that names it, so a renamed message fails here, not silently."""
    def without(marker):
        planted = copy.deepcopy(policy)
        kept = [v for v in planted["spec"]["validations"]
                if marker not in v.get("messageExpression", v.get("message", ""))]
        if len(kept) == len(planted["spec"]["validations"]):
            problems.append(f"self-test: the fencing policy has no validation whose message says {marker!r}")
        planted["spec"]["validations"] = kept
        return planted
    allows_everything = copy.deepcopy(policy)
    allows_everything["spec"]["validations"] = [{"expression": "true"}]
    never_matches = copy.deepcopy(policy)
    never_matches["spec"]["matchConditions"] = [{"name": "fenced", "expression": "false"}]
    def with_variable(name, expression):
        planted = copy.deepcopy(policy)
        for variable in planted["spec"]["variables"]:
            if variable["name"] == name:
                variable["expression"] = expression
        return planted
    trusted_may_move_the_token = copy.deepcopy(policy)
    for validation in trusted_may_move_the_token["spec"]["validations"]:
        validation["expression"] = validation["expression"].replace("variables.byLeader || variables.annotationsKept",
                                                                    "!variables.onObject || variables.annotationsKept")
    return [
        ("that allows everything", allows_everything),
        ("that matches no request", never_matches),
        ("without the token comparison", without("already seen for lock")),
        ("without the holder binding", without("fencing-holder must name")),
        ("that lets the token be removed", without("may not be removed")),
        ("that lets the lock change", without("fencing-lock annotation is immutable")),
        ("that lets a subresource write change the annotations", without("may not change")),
        ("that judges a subresource write as an update of the object", with_variable("onObject", "true")),
        ("that trusts no writer", with_variable("trusted", "false")),
        ("that trusts every writer", with_variable("trusted", "true")),
        ("that lets a trusted writer change the annotations", trusted_may_move_the_token),
    ]


def check_admission_policy(helm_docs):
    docs = helm_docs.get("every optional part on", [])
    check_fencing_policy(docs)
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith("-sidecar")]
    for policy in policies:
        problems.extend(admission_policy_problems(policy, "chart ValidatingAdmissionPolicy"))
        bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"
                    and d["spec"]["policyName"] == policy["metadata"]["name"]]
        if not bindings or bindings[0]["spec"].get("validationActions") != ["Deny"]:
            problems.append("chart: the sidecar's ValidatingAdmissionPolicy has no binding that denies")
    return policies


# --- the checks catch planted bugs -------------------------------------------

def check_checks_catch_planted_bugs(policies):
    no_user = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "planted"},
               "spec": {"template": {"spec": {"securityContext": {"runAsNonRoot": True},
                                              "containers": [{"name": "c", "image": "i"}]}}}}
    if not non_root_problems(no_user, "self-test"):
        problems.append("self-test: runAsNonRoot without runAsUser passed the non-root check")
    regular = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "planted"},
               "spec": {"containers": [{"name": "app", "image": "i"}, {"name": "leasehold", "image": OUR_IMAGE}]}}
    if not native_sidecar_problems(regular, "self-test"):
        problems.append("self-test: a regular-container sidecar passed the native-sidecar check")
    mount = {"name": "leasehold-bin", "mountPath": "/leasehold/bin"}
    wrapped = {"name": "app", "image": "i", "command": [RUNNER, "run", "--", "/app"], "volumeMounts": [mount]}
    installer = {"name": "leasehold-install", "image": OUR_IMAGE, "volumeMounts": [mount]}
    good = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "planted"},
            "spec": {"containers": [wrapped], "initContainers": [installer]}}
    if native_sidecar_problems(good, "self-test"):
        problems.append("self-test: a correctly wrapped `leasehold run` container failed the sidecar check")
    for planted, bug in [
        ({"initContainers": []}, "without the installer"),
        ({"initContainers": [dict(installer, restartPolicy="Always")]}, "with a restarting installer"),
        ({"containers": [dict(wrapped, volumeMounts=[])]}, "without the binary's volume"),
    ]:
        pod = copy.deepcopy(good)
        pod["spec"].update(planted)
        if not native_sidecar_problems(pod, "self-test"):
            problems.append(f"self-test: a `leasehold run` container {bug} passed the sidecar check")
    everything = {"webhooks": [{"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]}}]}
    if not webhook_selector_problems(everything, "leasehold-system", "self-test"):
        problems.append("self-test: a webhook called for every pod passed the opt-in check")
    one_account = {"kind": "RoleBinding", "metadata": {"name": "lh-leasehold-sidecar", "namespace": "batch"},
                   "roleRef": {"name": "lh-leasehold-sidecar"},
                   "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "batch"}]}
    if not sidecar_binding_problems([one_account], {"batch": ["consumer", "default"]}):
        problems.append("self-test: a sidecar RoleBinding missing a listed ServiceAccount passed the binding check")
    for policy in policies:
        permissive = copy.deepcopy(policy)
        permissive["spec"]["validations"] = [{"expression": "true"}]
        if not admission_policy_problems(permissive, "self-test"):
            problems.append("self-test: a policy that allows everything passed the admission policy check")
        broken = copy.deepcopy(policy)
        broken["spec"]["validations"][0]["expression"] = "object.metadata.nolabels.all(k, true)"
        if not admission_policy_problems(broken, "self-test"):
            problems.append("self-test: a policy whose CEL fails to evaluate passed the admission policy check")



def main():
    schemas = crd_schemas()
    if not schemas:
        problems.append("crds/: no CustomResourceDefinition found")
    objects = check_manifests(schemas)
    check_validator_catches_errors(schemas)
    check_chart()
    check_dockerfile()
    helm_docs = check_helm(schemas)
    check_chart_values(schemas)
    check_webhook_opt_in(helm_docs)
    policies = check_admission_policy(helm_docs)
    if not policies:
        problems.append("chart (every optional part on): no ValidatingAdmissionPolicy to check")
    check_checks_catch_planted_bugs(policies)
    check_files(sys.argv[1:], schemas)
    for problem in problems:
        print(problem)
    print(f"checked {objects} manifest objects against Kubernetes {K8S_VERSION}: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
