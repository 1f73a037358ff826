"""A structural check of deploy/k8s/ (no cluster, no OpenAPI schema here): objects, references, probes, GPUs.

``check_k8s(docs)`` takes the parsed objects and returns the problems found, each a sentence naming the
object and what to fix. The checks: every object is a kind we use with its apiVersion and the fields it
needs; selectors select; every Secret/ConfigMap/Service/volume named exists (secret keys included); the
Secret template holds no value; each worker's command parses with the real CLI, its env names are the
ones the code reads, its probes check its own role, GPU roles ask for a GPU, and SIGTERM gets its grace; only
Prometheus's pods reach a worker's metrics port (NetworkPolicy).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.deploy import worker_contract as contract

K8S_DIR = contract.REPO / "deploy" / "k8s"
SECRET_TEMPLATE = K8S_DIR / "keys.template.yaml"

API_VERSIONS = {
    "Namespace": "v1",
    "Secret": "v1",
    "ConfigMap": "v1",
    "Service": "v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
}
WORKLOADS = ("Deployment", "StatefulSet")
OWN_IMAGE_PREFIX = "dgrpo-"
"""deploy/docker/'s images, as the manifests name them (kustomize points them at a registry)."""
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

Obj = dict[str, Any]


def load_k8s(directory: Path = K8S_DIR) -> list[Obj]:
    """The objects kustomization.yaml applies, and the Secret template they reference."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    files = [directory / name for name in kustomization["resources"]] + [directory / SECRET_TEMPLATE.name]
    return [doc for path in files for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def name_of(obj: Obj) -> str:
    return f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"


def by_kind(docs: list[Obj], kind: str) -> dict[str, Obj]:
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == kind and "metadata" in d}


def containers(workload: Obj) -> Iterator[tuple[str, Obj]]:
    for c in workload["spec"]["template"]["spec"].get("containers", []):
        yield f"{name_of(workload)} container {c.get('name')}", c


def check_k8s(docs: list[Obj]) -> list[str]:
    problems = check_objects(docs)
    if problems:
        return problems  # the rest reads fields these checks vouch for
    return (
        check_workloads(docs)
        + check_secret_template(docs)
        + check_temporal_config(docs)
        + check_metrics_reach(docs)
    )


def check_objects(docs: list[Obj]) -> list[str]:
    problems: list[str] = []
    namespaces = set(by_kind(docs, "Namespace"))
    for d in docs:
        kind, meta = d.get("kind"), d.get("metadata") or {}
        if kind not in API_VERSIONS:
            problems.append(
                f"{name_of(d)}: kind {kind!r} is not one this check knows ({sorted(API_VERSIONS)})"
            )
            continue
        if d.get("apiVersion") != API_VERSIONS[kind]:
            problems.append(
                f"{name_of(d)}: apiVersion {d.get('apiVersion')!r}, expected {API_VERSIONS[kind]}"
            )
        if not DNS_LABEL.match(str(meta.get("name", ""))):
            problems.append(f"{name_of(d)}: metadata.name must be a DNS label")
        if kind != "Namespace" and meta.get("namespace") not in namespaces:
            problems.append(
                f"{name_of(d)}: namespace {meta.get('namespace')!r} is not one of {sorted(namespaces)}"
            )
        if kind in WORKLOADS:
            problems += check_workload_shape(d)
        if kind == "Service":
            problems += check_service(d, docs)
    return problems


def check_workload_shape(d: Obj) -> list[str]:
    spec = d.get("spec") or {}
    template = spec.get("template") or {}
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    problems = []
    if not selector or any(labels.get(k) != v for k, v in selector.items()):
        problems.append(
            f"{name_of(d)}: spec.selector.matchLabels {selector} must select the pod template's labels"
        )
    pod = template.get("spec") or {}
    if not pod.get("containers"):
        problems.append(f"{name_of(d)}: the pod template has no containers")
    for c in pod.get("containers", []):
        if not c.get("name") or not c.get("image"):
            problems.append(f"{name_of(d)}: every container needs a name and an image")
    return problems


def check_service(svc: Obj, docs: list[Obj]) -> list[str]:
    selector = svc.get("spec", {}).get("selector") or {}
    pods = [w["spec"]["template"]["metadata"].get("labels", {}) for w in docs if w.get("kind") in WORKLOADS]
    problems = []
    if not selector or not any(all(labels.get(k) == v for k, v in selector.items()) for labels in pods):
        problems.append(f"{name_of(svc)}: selector {selector} selects no pod here")
    ports = svc.get("spec", {}).get("ports") or []
    if not ports or not all(isinstance(p.get("port"), int) for p in ports):
        problems.append(f"{name_of(svc)}: every port needs a numeric port")
    selected = [
        w for w in docs if w.get("kind") in WORKLOADS and all(
            w["spec"]["template"]["metadata"].get("labels", {}).get(k) == v for k, v in selector.items()
        )
    ]  # fmt: skip
    declared = {p.get("name") for w in selected for _, c in containers(w) for p in c.get("ports", [])}
    for port in ports:
        target = port.get("targetPort")
        if isinstance(target, str) and target not in declared:
            problems.append(f"{name_of(svc)}: targetPort {target!r} is no port the selected pods name")
    return problems


def service_ports(docs: list[Obj]) -> dict[str, set[int]]:
    return {name: {p["port"] for p in s["spec"]["ports"]} for name, s in by_kind(docs, "Service").items()}


def check_workloads(docs: list[Obj]) -> list[str]:
    problems: list[str] = []
    services = service_ports(docs)
    for w in (d for d in docs if d["kind"] in WORKLOADS):
        pod = w["spec"]["template"]["spec"]
        if w["kind"] == "StatefulSet" and w["spec"].get("serviceName") not in services:
            problems.append(f"{name_of(w)}: serviceName {w['spec'].get('serviceName')!r} is no Service here")
        volumes = {v["name"] for v in pod.get("volumes", [])}
        volumes |= {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        for where, c in containers(w):
            for mount in c.get("volumeMounts", []):
                if mount["name"] not in volumes:
                    problems.append(f"{where}: mounts volume {mount['name']!r}, which the pod does not have")
            problems += check_container(w, c, where, docs, services)
        for c in pod.get("initContainers", []):  # runs to its end: a command of its image, no probes
            where = f"{name_of(w)} init container {c.get('name')}"
            for name, value in container_env(c, docs, where, problems).items():
                if value is not None:
                    problems += contract.check_address(name, value, services, where)
            problems += contract.check_tool(list(c.get("command") or []), c["image"], where)
    problems += contract.temporal_release_problems(
        [c["image"] for w in docs if w["kind"] in WORKLOADS for c in pod_containers(w)]
    )
    return problems


def pod_containers(workload: Obj) -> list[Obj]:
    pod = workload["spec"]["template"]["spec"]
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def container_env(c: Obj, docs: list[Obj], where: str, problems: list[str]) -> dict[str, str | None]:
    """The container's variables (None: from a Secret), checking every Secret and ConfigMap it names."""
    secrets = {
        name: set((s.get("stringData") or {}) | (s.get("data") or {}))
        for name, s in by_kind(docs, "Secret").items()
    }
    configs = {name: cm.get("data") or {} for name, cm in by_kind(docs, "ConfigMap").items()}
    env: dict[str, str | None] = {}
    for source in c.get("envFrom", []):
        if "configMapRef" in source:
            name = source["configMapRef"]["name"]
            if name not in configs:
                problems.append(f"{where}: envFrom ConfigMap {name!r} does not exist")
            env |= {k: str(v) for k, v in configs.get(name, {}).items()}
        else:
            problems.append(f"{where}: envFrom {sorted(source)} is not a ConfigMap (secrets go by key)")
    for item in c.get("env", []):
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if ref is not None:
            if ref["name"] not in secrets:
                problems.append(f"{where}: {item['name']} reads Secret {ref['name']!r}, which does not exist")
            elif ref["key"] not in secrets[ref["name"]]:
                problems.append(
                    f"{where}: {item['name']} reads key {ref['key']!r}, not in Secret {ref['name']}"
                )
            env[item["name"]] = None
        elif "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            problems.append(f"{where}: {item.get('name')} has neither a value nor a secretKeyRef")
    return env


def check_container(w: Obj, c: Obj, where: str, docs: list[Obj], services: dict[str, set[int]]) -> list[str]:
    problems: list[str] = []
    env = container_env(c, docs, where, problems)
    for name, value in env.items():
        if value is not None:
            problems += contract.check_address(name, value, services, where)
    worker = contract.Command([])
    if contract.image_repo(c["image"]) in contract.IMAGE_TOOLS:
        problems += contract.check_tool(list(c.get("command") or []), c["image"], where)
    elif c.get("command"):
        worker = contract.read_command(list(c["command"]) + list(c.get("args", [])), where, problems)
    elif contract.image_repo(c["image"]).startswith(OWN_IMAGE_PREFIX):
        problems.append(f"{where}: an image of this project states its command (`dgrpo worker ROLE ...`)")
    role = contract.worker_role(worker)
    ports = {p["containerPort"] for p in c.get("ports", [])} | {p.get("name") for p in c.get("ports", [])}
    if role is not None:
        problems += contract.check_worker_env(env, where)
        problems += contract.check_serving_env(env, {p["containerPort"] for p in c.get("ports", [])}, where)
        problems += check_scraped(w, env, {p["containerPort"] for p in c.get("ports", [])}, where)
        grace = w["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
        if grace < contract.WORKER_GRACE_S:
            problems.append(f"{where}: terminationGracePeriodSeconds {grace} < {contract.WORKER_GRACE_S}")
        gpus = int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
        if role in contract.GPU_ROLES and gpus < 1:
            problems.append(f"{where}: a {role} worker needs resources.limits nvidia.com/gpu: 1")
    for kind in ("readinessProbe", "livenessProbe"):
        probe = c.get(kind)
        if probe is None:
            problems.append(f"{where}: no {kind} (every long-running container has one)")
            continue
        problems += check_probe_shape(probe, worker, c["image"], ports, f"{where} {kind}")
    if "startupProbe" in c:
        problems += check_probe_shape(c["startupProbe"], worker, c["image"], ports, f"{where} startupProbe")
    return problems


def check_scraped(w: Obj, env: dict[str, str | None], ports: set[int], where: str) -> list[str]:
    """The worker serves metrics, and its pod asks Prometheus (``prometheus.io/*`` annotations) for that port."""
    problems, port = contract.check_metrics(env, ports, where)
    annotations = w["spec"]["template"]["metadata"].get("annotations") or {}
    if annotations.get("prometheus.io/scrape") != "true":
        problems.append(
            f'{where}: the pod lacks the annotation prometheus.io/scrape: "true" (no one scrapes it)'
        )
    elif port is not None and annotations.get("prometheus.io/port") != str(port):
        problems.append(
            f"{where}: prometheus.io/port {annotations.get('prometheus.io/port')!r} is not the metrics port {port}"
        )
    return problems


def check_temporal_config(docs: list[Obj]) -> list[str]:
    """The Temporal server reads a dynamic config (a mounted ConfigMap) that turns priority and fairness on."""
    for w in (d for d in docs if d["kind"] in WORKLOADS):
        for where, c in containers(w):
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            if contract.image_repo(c["image"]) != contract.TEMPORAL_SERVER:
                continue
            path = env.get("DYNAMIC_CONFIG_FILE_PATH")
            mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
            mount = mounts.get(f"/etc/temporal/{path}") if path else None
            volumes = {v["name"]: v for v in w["spec"]["template"]["spec"].get("volumes", [])}
            source = (volumes.get(mount["name"], {}) if mount else {}).get("configMap", {}).get("name")
            config = (
                by_kind(docs, "ConfigMap").get(str(source), {}).get("data", {}).get(mount.get("subPath"))
                if mount
                else None
            )
            if config is None:
                return [f"{where}: DYNAMIC_CONFIG_FILE_PATH must name a file mounted from a ConfigMap"]
            return contract.dynamic_config_problems(yaml.safe_load(config) or {}, where)
    return ["no Temporal server here"]


def check_probe_shape(
    probe: Obj, worker: contract.Command, image: str, ports: set[Any], where: str
) -> list[str]:
    if "exec" in probe:
        return contract.check_probe(list(probe["exec"]["command"]), worker, image, where)
    for kind in ("httpGet", "tcpSocket", "grpc"):
        if kind in probe:
            port = probe[kind].get("port")
            return [] if port in ports else [f"{where}: port {port!r} is not a port the container declares"]
    return [f"{where}: neither exec, httpGet, tcpSocket nor grpc"]


def check_secret_template(docs: list[Obj]) -> list[str]:
    """The committed Secret is a template: every key present, every value empty."""
    problems = []
    for name, secret in by_kind(docs, "Secret").items():
        for key, value in ((secret.get("stringData") or {}) | (secret.get("data") or {})).items():
            if value not in ("", None):
                problems.append(f"Secret {name}: {key} holds a value; the committed template must hold none")
    return problems


PROMETHEUS = {"app.kubernetes.io/name": "prometheus"}
"""The label of the pods that may scrape a worker's metrics (the Prometheus Operator's)."""


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """A ``matchLabels`` selector (``{}``: every pod) over a pod's labels."""
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def check_metrics_reach(docs: list[Obj]) -> list[str]:
    """Only Prometheus's pods reach a worker's metrics port: a NetworkPolicy selects the pod for ingress, and every
    ingress rule that admits the port admits only pods labelled ``PROMETHEUS``; a named port a rule gives is one
    the pod declares."""
    problems: list[str] = []
    policies = list(by_kind(docs, "NetworkPolicy").values())
    for w in (d for d in docs if d["kind"] in WORKLOADS):
        labels = w["spec"]["template"]["metadata"].get("labels") or {}
        guarding = [
            p
            for p in policies
            if selects(p["spec"].get("podSelector") or {}, labels)
            and "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])
        ]
        for where, c in containers(w):
            bind = container_env(c, docs, where, []).get(contract.settings.ENV_METRICS_BIND)
            if (
                not bind
                or contract.worker_role(contract.read_command(list(c.get("command", [])), where, [])) is None
            ):
                continue
            port = int(bind.rpartition(":")[2])
            if not guarding:
                problems.append(
                    f"{where}: its metrics port {port} is open to every pod: no NetworkPolicy selects the pod "
                    "for Ingress (let only Prometheus reach it)"
                )
            names = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            for policy in guarding:
                for n, rule in enumerate(policy["spec"].get("ingress") or []):
                    problems += check_ingress_rule(
                        rule, f"{name_of(policy)}: ingress rule {n}", where, names, port
                    )
    return problems


def check_ingress_rule(rule: Obj, rule_name: str, where: str, names: dict[str, int], port: int) -> list[str]:
    """One ingress rule over a worker container (its named ports ``names``, its metrics ``port``)."""
    problems = [
        f"{rule_name} names port {entry['port']!r}, which {where} does not declare (it admits nothing there)"
        for entry in rule.get("ports") or []
        if isinstance(entry.get("port"), str) and entry["port"] not in names
    ]
    ports = rule.get("ports")
    admits = ports is None or any(names.get(e.get("port"), e.get("port")) == port for e in ports)
    peers = rule.get("from") or []
    only_prometheus = bool(peers) and all(
        "ipBlock" not in peer
        and PROMETHEUS.items() <= ((peer.get("podSelector") or {}).get("matchLabels") or {}).items()
        for peer in peers
    )
    if admits and not only_prometheus:
        problems.append(f"{rule_name} lets pods other than Prometheus's reach {where}'s metrics port {port}")
    return problems
