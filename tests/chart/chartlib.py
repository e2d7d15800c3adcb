"""Helpers for the chart tests: the real ``helm`` binary and the real ``kubernetes-validate``.

``helm`` comes from ``.tools/bin`` (``make deps`` installs it) or ``PATH``; a missing helm fails the
tests loudly instead of skipping them. Manifests are validated by running the ``kubernetes-validate``
CLI with ``--strict`` (unknown fields fail) for several Kubernetes versions in one process. That CLI
only *warns* about a kind it has no schema for and still exits 0, so :func:`validate_manifests`
treats every warning as a failure. It ships no CRD schemas; the Prometheus Operator and cert-manager
kinds the chart renders are checked here against the strict schemas in ``tests/chart/schemas``
instead, with the same Kubernetes definitions (ObjectMeta, LabelSelector) the CLI uses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate.utils as kv
import yaml
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sluice"
CI_VALUES = sorted(p for p in (CHART / "ci").glob("values-*.yaml"))
SCHEMAS = Path(__file__).resolve().parent / "schemas"

# Two Kubernetes minor versions the manifests must be valid for (kubernetes-validate ships 1.25+).
KUBE_VERSIONS = ("1.30.0", "1.33.0")

# (apiVersion, kind) -> bundled strict schema, for the CRD kinds kubernetes-validate cannot know.
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SCHEMAS / "servicemonitor-monitoring-v1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): SCHEMAS / "podmonitor-monitoring-v1.json",
    ("cert-manager.io/v1", "Certificate"): SCHEMAS / "certificate-cert-manager-v1.json",
    ("cert-manager.io/v1", "Issuer"): SCHEMAS / "issuer-cert-manager-v1.json",
}

Manifest = dict[str, Any]


def helm_binary() -> str:
    local = ROOT / ".tools" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("helm")
    if found is None:
        raise RuntimeError(
            "helm is not installed: run `make deps` (scripts/install-tools.sh puts it in .tools/bin)"
        )
    return found


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm; with ``check`` a failure raises with helm's own output."""
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=60, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def template_args(
    values: Iterable[Path] = (),
    sets: Iterable[str] = (),
    release: str = "sluice",
    api_versions: Iterable[str] = (),
) -> list[str]:
    """``api_versions``: APIs the chart is told the cluster has (``cert-manager.io/v1``), as it sees them
    with ``.Capabilities.APIVersions.Has`` in a real install."""
    args = ["template", release, str(CHART), "--namespace", "sluice-test"]
    for path in values:
        args += ["-f", str(path)]
    for item in sets:
        args += ["--set", item]
    for api in api_versions:
        args += ["--api-versions", api]
    return args


def render(
    values: Iterable[Path] = (),
    sets: Iterable[str] = (),
    release: str = "sluice",
    api_versions: Iterable[str] = (),
) -> list[Manifest]:
    """``helm template`` the chart and parse every non-empty document."""
    out = helm(*template_args(values, sets, release, api_versions)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def render_error(values: Iterable[Path] = (), sets: Iterable[str] = ()) -> str:
    """``helm template`` that must fail; returns its error output."""
    proc = helm(*template_args(values, sets), check=False)
    assert proc.returncode != 0, f"helm template unexpectedly succeeded with {list(values)} {list(sets)}"
    return proc.stderr


def find(manifests: Sequence[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)]


def one(manifests: Sequence[Manifest], kind: str, name: str) -> Manifest:
    found = find(manifests, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


@dataclass(frozen=True)
class Problem:
    source: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.message}"


def validate_manifests(
    sets: Mapping[str, Sequence[Manifest]], versions: Sequence[str] = KUBE_VERSIONS
) -> list[Problem]:
    """Validate named groups of manifests for every version; returns the problems (empty: all valid).

    Built-in kinds go through one ``kubernetes-validate --strict`` run over one file per group, so
    the schemas load once per process; CRD kinds go through :func:`_validate_crd`.
    """
    problems: list[Problem] = []
    with tempfile.TemporaryDirectory(prefix="sluice-kubeval-") as tmp:
        files: list[str] = []
        for name, manifests in sets.items():
            builtin = [m for m in manifests if (m.get("apiVersion"), m.get("kind")) not in CRD_SCHEMAS]
            for m in manifests:
                if (m.get("apiVersion"), m.get("kind")) in CRD_SCHEMAS:
                    problems += [Problem(name, msg) for v in versions for msg in _validate_crd(m, v)]
            if builtin:
                path = Path(tmp) / f"{name}.yaml"
                path.write_text(yaml.safe_dump_all(builtin, sort_keys=False))
                files.append(str(path))
        if files:
            problems += _run_kubernetes_validate(files, versions)
    return problems


def _run_kubernetes_validate(files: Sequence[str], versions: Sequence[str]) -> list[Problem]:
    cmd = [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet"]
    for v in versions:
        cmd += ["-k", v]
    proc = subprocess.run([*cmd, *files], capture_output=True, text=True, timeout=120, check=False)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    # --quiet leaves only WARN (no schema for the kind), ERROR and FATAL lines; each one is a failure.
    problems = [Problem("kubernetes-validate", ln) for ln in lines]
    if proc.returncode != 0 and not problems:
        problems.append(Problem("kubernetes-validate", f"exited {proc.returncode} without output"))
    return problems


@cache
def _definitions(version: str) -> Registry:
    """The Kubernetes definitions kubernetes-validate itself uses for ``version``."""
    minor = ".".join(version.split(".")[:2])
    chosen = [v for v in kv.all_versions() if _minor_key(v) <= _minor_key(minor)][-1]
    defs = kv.schema_contents(f"kubernetes-json-schema/v{chosen}-local-strict/_definitions.json", version)
    return Resource.from_contents(defs) @ Registry()


def _minor_key(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def _validate_crd(manifest: Manifest, version: str) -> list[str]:
    path = CRD_SCHEMAS[(manifest["apiVersion"], manifest["kind"])]
    schema = json.loads(path.read_text())
    registry = Resource.from_contents(schema) @ _definitions(version)
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    where = f"{manifest['kind'].lower()}/{manifest['metadata'].get('name')} (Kubernetes {version})"
    return [
        f"{where}: {'.'.join(str(p) for p in err.absolute_path) or '<root>'}: {err.message}"
        for err in validator.iter_errors(manifest)
    ]
