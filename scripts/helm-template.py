#!/usr/bin/env python3
"""`helm template` without a helm binary: renders a chart with Helm v4's Go SDK
(helm-python-sdk) and prints the objects as YAML, for `kubectl apply
--server-side -f -`. Used by the end-to-end suite to install the chart the way
the README's `helm install` does.

  helm-template.py RELEASE CHART [-n NAMESPACE] [--set KEY=VALUE]...

Like `helm template`, it leaves out the chart's crds/ folder: apply crds/ first.

--set follows Helm's basic syntax: dotted keys, `{a,b}` lists, true/false,
integers, anything else a string.
"""
import argparse
import sys

import helm_python
import yaml


def parse_value(text):
    if text.startswith("{") and text.endswith("}"):
        inner = text[1:-1]
        return [parse_value(v) for v in inner.split(",")] if inner else []
    if text in ("true", "false"):
        return text == "true"
    if text.lstrip("-").isdigit():
        return int(text)
    return text


def set_value(values, assignment):
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        sys.exit(f"--set {assignment!r}: expected KEY=VALUE")
    *parents, leaf = key.split(".")
    node = values
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            sys.exit(f"--set {assignment!r}: {part} is not a map")
    node[leaf] = parse_value(raw)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("release")
    p.add_argument("chart")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("--set", action="append", default=[], dest="sets")
    a = p.parse_args()
    values = {}
    for assignment in a.sets:
        set_value(values, assignment)
    chart = helm_python.Chart.load(a.chart)
    try:
        rendered = chart.render(values, name=a.release, namespace=a.namespace, is_install=True)
    except helm_python.HelmError as e:
        sys.exit(f"helm template: {e}")
    docs = []
    for template, text in sorted(rendered.items()):
        if template.endswith(".txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d is not None)
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False))


if __name__ == "__main__":
    main()
