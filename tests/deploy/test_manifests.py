"""deploy/ checked without a cluster or Docker (CI has neither): every YAML parses, and the Kubernetes
manifests pass k8s_checks.py while each check is shown to fail on a copy with one planted defect (the compose
cluster: test_compose_cluster.py)."""

from __future__ import annotations

import copy
import re
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.deploy import k8s_checks as k8s
from tests.deploy import worker_contract as contract
from workers.stack import TEMPORAL_DYNAMIC_CONFIG, find_binary

Docs = list[dict[str, Any]]
COMPOSE_CLUSTER = contract.REPO / "deploy" / "cluster" / "compose.yaml"


def test_every_yaml_under_deploy_parses() -> None:
    files = sorted((contract.REPO / "deploy").rglob("*.yaml"))
    assert len(files) >= 12
    for path in files:
        assert list(yaml.safe_load_all(path.read_text())), path


def test_kustomization_applies_every_manifest_but_the_secret_template() -> None:
    listed = set(yaml.safe_load((k8s.K8S_DIR / "kustomization.yaml").read_text())["resources"])
    on_disk = {p.name for p in k8s.K8S_DIR.glob("*.yaml")} - {"kustomization.yaml", k8s.SECRET_TEMPLATE.name}
    assert listed == on_disk


def test_the_k8s_manifests_pass_every_check() -> None:
    docs = k8s.load_k8s()
    assert k8s.check_k8s(docs) == []
    kinds = sorted(f"{d['kind']} {d['metadata']['name']}" for d in docs)
    for needed in (
        "StatefulSet postgres",
        "StatefulSet minio",
        "Deployment temporal",
        "Secret dgrpo-secrets",
    ):
        assert needed in kinds
    assert deployed_roles_k8s(docs) == {"control": 1, "inference": 2, "trainer": 1}


def test_the_variables_a_worker_reads_outside_settings_are_read_in_the_code() -> None:
    for name, reader in contract.OTHER_ENV.items():
        assert f'"{name}"' in (contract.REPO / reader).read_text(), f"{reader} no longer reads {name}"


def test_a_judge_key_is_a_variable_the_control_worker_reads_only_where_it_allows_it() -> None:
    docs = copy.deepcopy(k8s.load_k8s())
    key = {
        "name": "OPENAI_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "dgrpo-secrets", "key": "wandb-api-key"}},
    }
    container(docs, "control")["env"].append(key)
    assert any("sets OPENAI_API_KEY, which no worker reads" in p for p in k8s.check_k8s(docs))
    container(docs, "control")["env"].append(
        {"name": "DGRPO_JUDGE_KEY_ENVS", "value": "https://api.openai.com/v1=OPENAI_API_KEY"}
    )
    assert k8s.check_k8s(docs) == []


def test_temporal_has_one_fairness_setup_in_compose_k8s_and_the_embedded_stack() -> None:
    in_k8s = yaml.safe_load(obj(k8s.load_k8s(), "ConfigMap", "temporal-dynamic-config")["data"]["dgrpo.yaml"])
    in_compose = yaml.safe_load(
        (contract.REPO / "deploy" / "cluster" / "temporal-dynamicconfig.yaml").read_text()
    )
    assert in_k8s == in_compose and contract.dynamic_config_problems(in_k8s, "k8s") == []
    embedded = {key: value for key, value in TEMPORAL_DYNAMIC_CONFIG.items() if key in in_k8s}
    assert embedded == {key: str(values[0]["value"]).lower() for key, values in in_k8s.items()}


def test_the_cluster_runs_the_temporal_release_the_embedded_stack_and_the_tests_run() -> None:
    """deploy/k8s and deploy/cluster run Temporal of the release of ``temporal server start-dev`` here (the
    release every test of fairness runs on), server and schema tools alike."""
    shown = subprocess.run([find_binary("temporal"), "--version"], capture_output=True, text=True, check=True)
    release = re.search(r"Server (\d+\.\d+\.\d+)", shown.stdout)
    assert release is not None, shown.stdout
    in_k8s = [c["image"] for w in k8s.load_k8s() if w["kind"] in k8s.WORKLOADS for c in k8s.pod_containers(w)]
    in_compose = [
        str(svc.get("image", "")) for svc in yaml.safe_load(COMPOSE_CLUSTER.read_text())["services"].values()
    ]
    temporal = [i for i in in_k8s + in_compose if i.startswith("temporalio/")]
    assert len(temporal) == 6 and {i.rpartition(":")[2] for i in temporal} == {release.group(1)}, temporal


def test_the_single_machine_compose_starts_its_workers_again_after_they_exit() -> None:
    """deploy/compose.yaml's workers (its services built from this project) restart after exiting, as a trainer
    whose compute thread was stuck does (exit 75); deploy/cluster's are checked by compose_checks.py."""
    services = yaml.safe_load((contract.REPO / "deploy" / "compose.yaml").read_text())["services"]
    workers = {name: svc for name, svc in services.items() if "build" in svc}
    assert set(workers) == {"control", "inference", "trainer"}
    assert {
        name: svc.get("restart")
        for name, svc in workers.items()
        if svc.get("restart") not in contract.RESTARTS
    } == {}


def deployed_roles_k8s(docs: Docs) -> dict[str, int]:
    roles = {}
    for d in docs:
        if d["kind"] == "Deployment":
            for _, c in k8s.containers(d):
                role = contract.worker_role(contract.read_command(c.get("command", []), "", []))
                if role:
                    roles[role] = d["spec"]["replicas"]
    return roles


# --- each k8s check fails on a planted defect --------------------------------------------------------------


def obj(docs: Docs, kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def container(docs: Docs, name: str) -> dict[str, Any]:
    kind = "Deployment" if name in ("control", "inference", "trainer", "temporal") else "StatefulSet"
    return obj(docs, kind, name)["spec"]["template"]["spec"]["containers"][0]


def env_item(docs: Docs, name: str, var: str) -> dict[str, Any]:
    return next(e for e in container(docs, name)["env"] if e["name"] == var)


K8S_DEFECTS: dict[str, tuple[Callable[[Docs], Any], str]] = {
    "env name no worker reads": (
        lambda d: container(d, "inference")["env"].append({"name": "DGRPO_TEMPORAL_ADRESS", "value": "x"}),
        "sets DGRPO_TEMPORAL_ADRESS, which no worker reads",
    ),
    "ConfigMap key no worker reads": (
        lambda d: obj(d, "ConfigMap", "dgrpo-config")["data"].update(DGRPO_S3_BUCKETS="x"),
        "sets DGRPO_S3_BUCKETS, which no worker reads",
    ),
    "required env missing": (
        lambda d: container(d, "trainer")["env"].remove(env_item(d, "trainer", "DGRPO_S3_SECRET_KEY")),
        "does not set DGRPO_S3_SECRET_KEY",
    ),
    "unknown worker flag": (
        lambda d: container(d, "inference")["command"].append("--engines"),
        "refused by the dgrpo CLI: dgrpo: error: unrecognized arguments: --engines",
    ),
    "unknown subcommand": (
        lambda d: container(d, "control").update(command=["dgrpo", "wroker", "control"]),
        "refused by the dgrpo CLI",
    ),
    "unknown role": (
        lambda d: container(d, "control").update(command=["dgrpo", "worker", "controller"]),
        "invalid choice: 'controller'",
    ),
    "worker without a command": (
        lambda d: container(d, "trainer").pop("command"),
        "an image of this project states its command",
    ),
    "command not of this project": (
        lambda d: container(d, "control").update(command=["celery", "worker"]),
        "`celery worker` runs nothing this project provides",
    ),
    "secret key missing": (
        lambda d: env_item(d, "inference", "DGRPO_S3_SECRET_KEY")["valueFrom"]["secretKeyRef"].update(
            key="s3-key"
        ),
        "reads key 's3-key', not in Secret dgrpo-secrets",
    ),
    "secret missing": (
        lambda d: env_item(d, "postgres", "POSTGRES_PASSWORD")["valueFrom"]["secretKeyRef"].update(name="pg"),
        "reads Secret 'pg', which does not exist",
    ),
    "ConfigMap missing": (
        lambda d: container(d, "control")["envFrom"][0]["configMapRef"].update(name="config"),
        "envFrom ConfigMap 'config' does not exist",
    ),
    "address of no service": (
        lambda d: obj(d, "ConfigMap", "dgrpo-config")["data"].update(DGRPO_S3_ENDPOINT="s3:9000"),
        "DGRPO_S3_ENDPOINT=s3:9000 names s3, which is no service here",
    ),
    "port the service does not serve": (
        lambda d: obj(d, "ConfigMap", "dgrpo-config")["data"].update(DGRPO_TEMPORAL_ADDRESS="temporal:7234"),
        "service temporal serves ports [7233], not 7234",
    ),
    "Temporal pointed at no database": (
        lambda d: env_item(d, "temporal", "POSTGRES_SEEDS").update(value="postgresql"),
        "POSTGRES_SEEDS=postgresql names postgresql",
    ),
    "no liveness probe": (lambda d: container(d, "trainer").pop("livenessProbe"), "no livenessProbe"),
    "no readiness probe": (lambda d: container(d, "minio").pop("readinessProbe"), "no readinessProbe"),
    "probe of another role": (
        lambda d: container(d, "inference")["readinessProbe"]["exec"].update(
            command=["python3", "-m", "workers.health", "trainer"]
        ),
        "probes role trainer, but the container is a inference worker",
    ),
    "probe of another queue": (
        lambda d: container(d, "trainer")["command"].extend(["--trainer-queue", "gpu-trainers"]),
        "probes queue dgrpo-trainer, but the worker polls gpu-trainers",
    ),
    "probe flag unknown": (
        lambda d: container(d, "control")["livenessProbe"]["exec"]["command"].extend(
            ["--max-age-minutes", "5"]
        ),
        "refused by workers.health",
    ),
    "probe module unknown": (
        lambda d: container(d, "control")["livenessProbe"]["exec"].update(
            command=["python3", "-m", "workers.ping"]
        ),
        "`python -m workers.ping` is not a module",
    ),
    "probe tool the image lacks": (
        lambda d: container(d, "postgres")["livenessProbe"]["exec"].update(
            command=["curl", "localhost:5432"]
        ),
        "image postgres:16 has no `curl`",
    ),
    "probe port not declared": (
        lambda d: container(d, "minio")["livenessProbe"]["httpGet"].update(port=9002),
        "port 9002 is not a port the container declares",
    ),
    "inference without a GPU": (
        lambda d: container(d, "inference")["resources"].pop("limits"),
        "a inference worker needs resources.limits nvidia.com/gpu: 1",
    ),
    "trainer without a GPU": (
        lambda d: container(d, "trainer")["resources"]["limits"].pop("nvidia.com/gpu"),
        "a trainer worker needs resources.limits nvidia.com/gpu: 1",
    ),
    "grace shorter than the worker's": (
        lambda d: obj(d, "Deployment", "control")["spec"]["template"]["spec"].update(
            terminationGracePeriodSeconds=30
        ),
        "terminationGracePeriodSeconds 30 < 60",
    ),
    "a real key in the Secret template": (
        lambda d: obj(d, "Secret", "dgrpo-secrets")["stringData"].update({"s3-secret-key": "minio123"}),
        "s3-secret-key holds a value",
    ),
    "wrong apiVersion": (
        lambda d: obj(d, "Deployment", "trainer").update(apiVersion="v1"),
        "expected apps/v1",
    ),
    "unknown kind": (
        lambda d: obj(d, "Service", "minio").update(kind="Ingress"),
        "kind 'Ingress' is not one",
    ),
    "selector selects not the pods": (
        lambda d: obj(d, "Deployment", "inference")["spec"]["selector"]["matchLabels"].update(tier="gpu"),
        "must select the pod template's labels",
    ),
    "Service selects no pod": (
        lambda d: obj(d, "Service", "temporal")["spec"]["selector"].update(
            {"app.kubernetes.io/name": "tmprl"}
        ),
        "Service temporal: selector",
    ),
    "another namespace": (
        lambda d: obj(d, "ConfigMap", "dgrpo-config")["metadata"].update(namespace="default"),
        "namespace 'default' is not one of ['dgrpo']",
    ),
    "StatefulSet of no Service": (
        lambda d: obj(d, "StatefulSet", "postgres")["spec"].update(serviceName="pg"),
        "serviceName 'pg' is no Service here",
    ),
    "inference server beyond loopback without its key": (
        lambda d: container(d, "inference")["env"].remove(env_item(d, "inference", "DGRPO_SERVE_API_KEY")),
        "DGRPO_SERVE_HOST=0.0.0.0 serves beyond the container without DGRPO_SERVE_API_KEY",
    ),
    "serve port the container does not declare": (
        lambda d: env_item(d, "inference", "DGRPO_SERVE_PORT").update(value="8001"),
        "DGRPO_SERVE_PORT=8001 is not a port the container declares ([8000, 9464])",
    ),
    "judge URL without the server's key": (
        lambda d: container(d, "control")["env"].remove(env_item(d, "control", "DGRPO_SERVE_API_KEY")),
        "sets DGRPO_INFERENCE_URL without DGRPO_SERVE_API_KEY",
    ),
    "judge URL of a port the Service does not serve": (
        lambda d: env_item(d, "control", "DGRPO_INFERENCE_URL").update(value="http://inference:8080/v1"),
        "service inference serves ports [8000], not 8080",
    ),
    "Service targets a port the pods do not name": (
        lambda d: obj(d, "Service", "inference")["spec"]["ports"][0].update(targetPort="http"),
        "targetPort 'http' is no port the selected pods name",
    ),
    "worker serving no metrics": (
        lambda d: obj(d, "ConfigMap", "dgrpo-config")["data"].pop("DGRPO_METRICS_BIND"),
        "Deployment trainer container worker: serves no metrics: set DGRPO_METRICS_BIND",
    ),
    "metrics on loopback": (
        lambda d: obj(d, "ConfigMap", "dgrpo-config")["data"].update(DGRPO_METRICS_BIND="127.0.0.1:9464"),
        "DGRPO_METRICS_BIND=127.0.0.1:9464 binds loopback",
    ),
    "metrics port the container does not declare": (
        lambda d: container(d, "control").pop("ports"),
        "Deployment control container worker: DGRPO_METRICS_BIND port 9464 is not a port the container declares",
    ),
    "worker no one scrapes": (
        lambda d: obj(d, "Deployment", "inference")["spec"]["template"]["metadata"].pop("annotations"),
        "Deployment inference container worker: the pod lacks the annotation prometheus.io/scrape",
    ),
    "scrape of another port": (
        lambda d: obj(d, "Deployment", "trainer")["spec"]["template"]["metadata"]["annotations"].update(
            {"prometheus.io/port": "8000"}
        ),
        "prometheus.io/port '8000' is not the metrics port 9464",
    ),
    "Temporal without fairness": (
        lambda d: obj(d, "ConfigMap", "temporal-dynamic-config")["data"].update(
            {"dgrpo.yaml": "matching.useNewMatcher:\n  - value: true\n"}
        ),
        "must set matching.enableFairness to true",
    ),
    "Temporal reading no dynamic config": (
        lambda d: container(d, "temporal")["env"].remove(env_item(d, "temporal", "DYNAMIC_CONFIG_FILE_PATH")),
        "DYNAMIC_CONFIG_FILE_PATH must name a file mounted from a ConfigMap",
    ),
    "metrics open to every pod": (
        lambda d: d.remove(obj(d, "NetworkPolicy", "worker-metrics")),
        "Deployment trainer container worker: its metrics port 9464 is open to every pod",
    ),
    "metrics reached from any pod": (
        lambda d: obj(d, "NetworkPolicy", "worker-metrics")["spec"]["ingress"][0].update(
            {"from": [{"podSelector": {}}]}
        ),
        "NetworkPolicy worker-metrics: ingress rule 0 lets pods other than Prometheus's reach Deployment control",
    ),
    "metrics admitted by a rule of every port": (
        lambda d: obj(d, "NetworkPolicy", "inference-serve")["spec"]["ingress"][0].pop("ports"),
        "NetworkPolicy inference-serve: ingress rule 0 lets pods other than Prometheus's reach Deployment inference",
    ),
    "a rule naming a port the pods lack": (
        lambda d: obj(d, "NetworkPolicy", "worker-metrics")["spec"]["ingress"][0]["ports"][0].update(
            port="metric"
        ),
        "names port 'metric', which Deployment trainer container worker does not declare",
    ),
    "Temporal of a release without fairness": (
        lambda d: container(d, "temporal").update(image="temporalio/server:1.29.1"),
        "temporalio/server:1.29.1: fairness is generally available from Temporal 1.31",
    ),
    "Temporal unpinned": (
        lambda d: container(d, "temporal").update(image="temporalio/server:latest"),
        "temporalio/server:latest: pin a Temporal release",
    ),
    "schema of another release": (
        lambda d: obj(d, "Deployment", "temporal")["spec"]["template"]["spec"]["initContainers"][0].update(
            image="temporalio/admin-tools:1.31.0"
        ),
        "the Temporal images are of different releases",
    ),
    "init container of a tool the image lacks": (
        lambda d: obj(d, "Deployment", "temporal")["spec"]["template"]["spec"]["initContainers"][0].update(
            command=["bash", "-ec", "true"]
        ),
        "Deployment temporal init container schema: image temporalio/admin-tools:1.32.0 has no `bash`",
    ),
    "init container reading a Secret that does not exist": (
        lambda d: obj(d, "Deployment", "temporal")["spec"]["template"]["spec"]["initContainers"][0]["env"][
            -1
        ]["valueFrom"]["secretKeyRef"].update(name="pg"),
        "Deployment temporal init container schema: SQL_PASSWORD reads Secret 'pg', which does not exist",
    ),
    "mount of no volume": (
        lambda d: container(d, "trainer")["volumeMounts"].append({"name": "models", "mountPath": "/models"}),
        "mounts volume 'models', which the pod does not have",
    ),
}


@pytest.mark.parametrize("defect", sorted(K8S_DEFECTS))
def test_each_k8s_check_refuses_its_planted_defect(defect: str) -> None:
    plant, complaint = K8S_DEFECTS[defect]
    docs = copy.deepcopy(k8s.load_k8s())
    plant(docs)
    problems = k8s.check_k8s(docs)
    assert any(complaint in p for p in problems), problems
