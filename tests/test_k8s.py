"""deploy/k8s: valid against the Kubernetes schemas (offline: kubernetes-validate ships them), and
consistent with the commands they run (every argument parses, every name they refer to exists)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # the test extra (scripts/setup.sh): every release's schemas inside
import pytest
import yaml

from interlock.cli.main import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30.0"
"""The oldest release these manifests claim to work on (schemas of every release up to the newest
ship inside the package); each is also checked against the newest."""


def documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{p.name}:{d['kind']}/{d['metadata']['name']}", d)
        for p in sorted(K8S.glob("*.yaml"))
        for d in yaml.safe_load_all(p.read_text())
        if d
    ]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in documents() if d["kind"] == kind]


def containers() -> list[dict[str, Any]]:
    return [c for d in by_kind("Deployment") for c in d["spec"]["template"]["spec"]["containers"]]


def core_documents() -> list[tuple[str, dict[str, Any]]]:
    """The documents Kubernetes itself defines (the Prometheus Operator's CRDs have no schema here)."""
    return [(n, d) for n, d in documents() if not d["apiVersion"].startswith("monitoring.coreos.com/")]


@pytest.mark.parametrize(("name", "doc"), core_documents(), ids=[n for n, _ in core_documents()])
@pytest.mark.parametrize("version", [KUBERNETES_VERSION, "latest"])
def test_each_manifest_is_valid_against_the_kubernetes_schema(
    name: str, doc: dict[str, Any], version: str
) -> None:
    release = kubernetes_validate.latest_version() if version == "latest" else version
    kubernetes_validate.validate(doc, release, strict=True)  # raises naming the field


def test_the_validator_catches_a_misspelt_field() -> None:
    doc = by_kind("Deployment")[0]
    spec = dict(doc["spec"], replica=1)  # "replicas"
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(dict(doc, spec=spec), KUBERNETES_VERSION, strict=True)


def test_there_are_nats_a_frontend_and_a_worker_deployment_per_role() -> None:
    names = {d["metadata"]["name"] for d in by_kind("Deployment")}
    assert names == {"nats", "frontend", "worker-prefill", "worker-decode"}
    assert {s["metadata"]["name"] for s in by_kind("Service")} == {"nats", "frontend"}


def _expand(arg: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)


def test_every_command_line_parses_with_the_real_parser() -> None:
    """A renamed or removed flag fails here, not in a cluster."""
    for c in containers():
        assert c["image"].startswith("interlock:")
        env = {e["name"]: e.get("value", f"<{e['name']}>") for e in c.get("env", [])}
        args = [_expand(a, env) for a in c["args"]]
        module = importlib.import_module(SUBCOMMANDS[args[0]])
        module.build_parser().parse_args(args[1:])  # SystemExit(2) on an unknown flag


def test_workers_advertise_their_pod_and_join_by_role() -> None:
    for d in by_kind("Deployment"):
        if not d["metadata"]["name"].startswith("worker-"):
            continue
        (c,) = d["spec"]["template"]["spec"]["containers"]
        args = c["args"]
        role = d["metadata"]["name"].removeprefix("worker-")
        assert args[args.index("--role") + 1] == role
        assert args[args.index("--host") + 1] == "0.0.0.0"
        assert args[args.index("--advertise-host") + 1] == "$(POD_IP)"
        assert args[args.index("--instance-id") + 1] == "$(POD_NAME)"
        fields = {
            e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
            for e in c["env"]
            if "fieldRef" in e.get("valueFrom", {})
        }
        assert fields == {"POD_NAME": "metadata.name", "POD_IP": "status.podIP"}
        probe = c["readinessProbe"]["exec"]["command"]
        assert 'interlock worker control status --instance-id "$POD_NAME"' in probe[-1]
        kv_port = int(args[args.index("--kv-transfer-port") + 1])
        assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"kv-transfer": kv_port}
        assert (
            c["livenessProbe"]["tcpSocket"]["port"] == c["startupProbe"]["tcpSocket"]["port"] == "kv-transfer"
        )
        drain = float(args[args.index("--drain-grace") + 1])
        assert d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain


def test_the_frontend_is_live_on_live_and_ready_on_health() -> None:
    (d,) = [d for d in by_kind("Deployment") if d["metadata"]["name"] == "frontend"]
    (c,) = d["spec"]["template"]["spec"]["containers"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/live", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}


def test_services_select_pods_and_name_their_ports() -> None:
    deployments = by_kind("Deployment")
    for s in by_kind("Service"):
        selected = [
            d
            for d in deployments
            if s["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(selected) == 1, s["metadata"]["name"]
        ports = {p["name"] for c in selected[0]["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        assert {p["targetPort"] for p in s["spec"]["ports"]} <= ports
    for d in deployments:
        assert (
            d["spec"]["selector"]["matchLabels"].items()
            <= d["spec"]["template"]["metadata"]["labels"].items()
        )


def test_secrets_come_from_the_secret_and_variables_are_ones_interlock_reads() -> None:
    (secret,) = by_kind("Secret")
    keys = set(secret["stringData"])
    env_source = (ROOT / "interlock" / "env.py").read_text()
    for c in containers():
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                assert ref["name"] == secret["metadata"]["name"] and ref["key"] in keys, e
            if e["name"].startswith("INTERLOCK_"):
                assert f'"{e["name"]}"' in env_source, f"{e['name']} is not read by interlock/env.py"
            assert "PASSWORD" not in e["name"] and "SECRET" not in e["name"] or ref is not None, e
        assert not any("password" in a.lower() and "file" not in a.lower() for a in c["args"])


def test_the_service_monitor_scrapes_the_frontend_service_by_its_port_name() -> None:
    (monitor,) = by_kind("ServiceMonitor")
    (service,) = [s for s in by_kind("Service") if s["metadata"]["name"] == "frontend"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    endpoints = monitor["spec"]["endpoints"]
    assert {e["port"] for e in endpoints} <= ports
    assert all(e["path"] == "/metrics" for e in endpoints)
    assert [e.get("params") for e in endpoints] == [None, {"scope": ["fleet"]}]
