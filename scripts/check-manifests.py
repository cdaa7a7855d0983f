#!/usr/bin/env python3
"""Checks the install files without a cluster.

1. Every YAML file in crds/, manifests/ and the chart's static parts parses.
2. Every object in manifests/ validates against the Kubernetes schemas
   (kubernetes-validate, strict: unknown fields fail); DistributedLease
   objects against the CRD's own openAPIV3Schema.
3. The chart's values.yaml validates against values.schema.json, and every
   `.Values.x.y` a template uses exists in values.yaml.
4. The Dockerfile is multi-stage, runs as non-root, fetches nothing by ADD.
5. The checks themselves work: a broken Deployment must fail step 2.
Prints one line per problem and exits 1 when there is any.
"""
import pathlib
import re
import sys

import jsonschema
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
K8S_VERSION = "1.33.0"
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
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"{where}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}: {e.message} at {'/'.join(map(str, e.path))}"
    except kubernetes_validate.SchemaNotFoundError:
        return f"{where}: no schema for {key}"
    return None


def check_manifests(schemas):
    files = sorted((ROOT / "manifests").rglob("*.yaml"))
    if not files:
        problems.append("manifests/: no YAML files")
    count = 0
    for path in files:
        for doc in load_all(path):
            count += 1
            error = validate(doc, path.relative_to(ROOT), schemas)
            if error:
                problems.append(error)
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
    for template in sorted((chart / "templates").glob("*")):
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
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problems.append("Dockerfile: the final stage must run as a non-root USER")
    if re.search(r"^ADD\s+https?://", text, re.M):
        problems.append("Dockerfile: ADD of a remote URL")


def main():
    schemas = crd_schemas()
    if not schemas:
        problems.append("crds/: no CustomResourceDefinition found")
    objects = check_manifests(schemas)
    check_validator_catches_errors(schemas)
    check_chart()
    check_dockerfile()
    for problem in problems:
        print(problem)
    print(f"checked {objects} manifest objects against Kubernetes {K8S_VERSION}: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
