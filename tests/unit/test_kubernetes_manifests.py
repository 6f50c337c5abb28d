"""deploy/kubernetes: every document is valid for Kubernetes (the core kinds against the
OpenAPI schemas kubernetes-validate bundles, offline; the InferencePool, a CRD those schemas
lack, against its documented spec by hand), the pieces fit one another, model-boss accepts the
ConfigMap's settings and manifests, and docs/KUBERNETES.md shows the files as they are."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from model_boss.catalog.manifest import parse_manifest_text
from model_boss.settings import load_settings

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
FILES = sorted(DEPLOY.glob("*.yaml"))
# the oldest release with sidecar containers on by default (the inference extension's
# prerequisite), and the newest the tool bundles
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
POOL_API = "inference.networking.k8s.io/v1"


def documents() -> list[tuple[str, dict[str, Any]]]:
    return [(path.name, doc) for path in FILES
            for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def the(kind: str, name: str) -> dict[str, Any]:
    found = [doc for _file, doc in documents()
             if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} documents"
    return found[0]


def test_the_files_hold_every_piece() -> None:
    kinds = sorted((doc["kind"], doc["metadata"]["name"]) for _file, doc in documents())
    assert kinds == [("ConfigMap", "model-boss-config"), ("Deployment", "model-boss"),
                     ("Deployment", "model-boss-redis"), ("InferencePool", "model-boss"),
                     ("Service", "model-boss"), ("Service", "model-boss-redis")]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("file", "doc"), [
    pytest.param(file, doc, id=f"{file}:{doc['kind']}/{doc['metadata']['name']}")
    for file, doc in documents() if doc["apiVersion"] != POOL_API])
def test_core_kinds_match_the_openapi_schemas(file: str, doc: dict, version: str) -> None:
    try:  # strict: a misspelt or misplaced field is an error, not ignored
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{file}: {doc['kind']}/{doc['metadata']['name']} (Kubernetes {version}): "
                    f"{exc.message} at {'.'.join(map(str, exc.absolute_path))}")


def test_schema_validation_catches_a_broken_document() -> None:
    """The tool works offline here and refuses what the API server would."""
    deployment = the("Deployment", "model-boss")
    broken = {**deployment, "spec": {**deployment["spec"], "replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)


# InferencePool v1 (api/v1/inferencepool_types.go and shared_types.go of
# kubernetes-sigs/gateway-api-inference-extension): its fields and their rules
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                       r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def pool_problems(pool: dict[str, Any]) -> list[str]:
    """What the InferencePool CRD's schema would refuse in ``pool`` (its spec)."""
    problems = []
    if pool.get("apiVersion") != POOL_API or pool.get("kind") != "InferencePool":
        problems.append(f"apiVersion/kind: want {POOL_API} InferencePool")
    if not (pool.get("metadata") or {}).get("name"):
        problems.append("metadata.name: required")
    spec = pool.get("spec") or {}
    unknown = set(spec) - {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    if unknown:
        problems.append(f"spec: unknown fields {sorted(unknown)}")
    selector = spec.get("selector") or {}
    if set(selector) != {"matchLabels"}:
        problems.append("spec.selector: matchLabels only (required)")
    labels = selector.get("matchLabels") or {}
    if not 1 <= len(labels) <= 64:
        problems.append("spec.selector.matchLabels: 1 to 64 labels")
    for key, value in labels.items():
        if not (len(key) <= 253 and LABEL_KEY.match(key)):
            problems.append(f"spec.selector.matchLabels: bad key {key!r}")
        if not (isinstance(value, str) and len(value) <= 63 and LABEL_VALUE.match(value)):
            problems.append(f"spec.selector.matchLabels.{key}: bad value {value!r}")
    ports = spec.get("targetPorts") or []
    numbers = [port.get("number") for port in ports]
    if not 1 <= len(ports) <= 8:
        problems.append("spec.targetPorts: 1 to 8 ports (required)")
    if any(set(port) != {"number"} for port in ports):
        problems.append("spec.targetPorts: each a {number}")
    if not all(isinstance(n, int) and 1 <= n <= 65535 for n in numbers):
        problems.append("spec.targetPorts.number: 1 to 65535")
    if len(set(numbers)) != len(numbers):
        problems.append("spec.targetPorts: port number must be unique")
    if spec.get("appProtocol", "http") not in ("http", "kubernetes.io/h2c"):
        problems.append("spec.appProtocol: http or kubernetes.io/h2c")
    picker = spec.get("endpointPickerRef")
    if picker is not None:
        if set(picker) - {"group", "kind", "name", "port", "failureMode"}:
            problems.append("spec.endpointPickerRef: unknown fields")
        if not picker.get("name"):
            problems.append("spec.endpointPickerRef.name: required")
        if picker.get("kind", "Service") == "Service" and "port" not in picker:
            problems.append("spec.endpointPickerRef.port: required when kind is 'Service'")
        port = (picker.get("port") or {}).get("number", 1)
        if not (isinstance(port, int) and 1 <= port <= 65535):
            problems.append("spec.endpointPickerRef.port.number: 1 to 65535")
        if picker.get("failureMode", "FailClose") not in ("FailOpen", "FailClose"):
            problems.append("spec.endpointPickerRef.failureMode: FailOpen or FailClose")
    return problems


def test_the_inference_pool_matches_its_crd() -> None:
    assert pool_problems(the("InferencePool", "model-boss")) == []


@pytest.mark.parametrize(("change", "problem"), [
    ({"selector": {}}, "spec.selector.matchLabels: 1 to 64 labels"),
    ({"targetPorts": []}, "spec.targetPorts: 1 to 8 ports (required)"),
    ({"targetPorts": [{"number": 8210}, {"number": 8210}]},
     "spec.targetPorts: port number must be unique"),
    ({"targetPorts": [{"number": 70000}]}, "spec.targetPorts.number: 1 to 65535"),
    ({"endpointPickerRef": {"name": "epp"}},
     "spec.endpointPickerRef.port: required when kind is 'Service'"),
    ({"endpointPickerRef": {"name": "epp", "port": {"number": 9002}, "failureMode": "Open"}},
     "spec.endpointPickerRef.failureMode: FailOpen or FailClose"),
    ({"replicas": 2}, "spec: unknown fields ['replicas']"),
])
def test_the_pool_check_refuses_what_the_crd_refuses(change: dict, problem: str) -> None:
    pool = the("InferencePool", "model-boss")
    assert problem in pool_problems({**pool, "spec": {**pool["spec"], **change}})


def test_the_pieces_fit_together() -> None:
    deployment = the("Deployment", "model-boss")
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    (container,) = pod["spec"]["containers"]
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
    pool = the("InferencePool", "model-boss")["spec"]
    service = the("Service", "model-boss")["spec"]
    # the pool and the Service select model-boss's pods, on the port it listens on
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    assert service["selector"].items() <= labels.items()
    assert [p["number"] for p in pool["targetPorts"]] == [port]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    # one pod per node
    (term,) = pod["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    # the config and models volumes are mounted where the settings look
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["config"] == "/etc/model-boss" and mounts["models"] == "/models"
    assert container["args"][-1] == "/etc/model-boss/config.yaml"
    config_volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "config")
    assert config_volume["configMap"]["name"] == "model-boss-config"


def test_model_boss_accepts_the_config_map(tmp_path: Path) -> None:
    """The ConfigMap's files as the pod sees them: the settings load, the manifests parse,
    the Redis URL names the Redis Service."""
    data = the("ConfigMap", "model-boss-config")["data"]
    volume = next(v for v in the("Deployment", "model-boss")["spec"]["template"]["spec"]
                  ["volumes"] if v["name"] == "config")
    for item in volume["configMap"]["items"]:
        target = tmp_path / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data[item["key"]])
    settings = load_settings(tmp_path / "config.yaml", cluster_secret="from-the-secret")
    assert settings.cluster and settings.port == 8210 and settings.host == "0.0.0.0"
    assert str(settings.models_dir) == "/models"
    assert [str(p) for p in settings.manifests] == ["/etc/model-boss/manifests"]
    redis = the("Service", "model-boss-redis")["spec"]["ports"][0]["port"]
    assert settings.redis_url == f"redis://model-boss-redis:{redis}/0"
    assert parse_manifest_text(data["manifests.yaml"], "manifests.yaml")


def test_the_doc_shows_the_files_as_they_are() -> None:
    doc = (ROOT / "docs" / "KUBERNETES.md").read_text()
    for path in FILES:
        assert f"```yaml\n{path.read_text()}```" in doc, f"{path.name} differs in the doc"
