"""The Tiltfile (Starlark, which Python's parser reads) points at things that exist and fit together.

No cluster or Tilt runs here, so this checks the wiring: the image stage, the live-update path inside
the image, the chart and its dev values, the resource names the chart really renders, the
port-forwards, and the protos resource.
"""

from __future__ import annotations

import ast
from typing import Any

import pytest

from tests.chart.chartlib import CHART, ROOT, render

TILTFILE = ROOT / "Tiltfile"


def calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name
    ]


def literal(node: ast.expr, constants: dict[str, Any]) -> Any:
    """A literal, or a module-level constant's value; other expressions stay as nodes."""
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    try:
        return ast.literal_eval(node)
    except ValueError:
        return node


def kwargs(call: ast.Call, constants: dict[str, Any]) -> dict[str, Any]:
    return {k.arg: literal(k.value, constants) for k in call.keywords if k.arg}


@pytest.fixture(scope="module")
def tilt() -> tuple[ast.Module, dict[str, Any]]:
    tree = ast.parse(TILTFILE.read_text(), filename="Tiltfile")
    constants = {
        t.id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant)
    }
    return tree, constants


def test_image_build_targets_the_dev_stage_and_syncs_into_the_installed_package(
    tilt: tuple[ast.Module, dict[str, Any]],
) -> None:
    tree, constants = tilt
    (build,) = calls(tree, "docker_build_with_restart")
    args = kwargs(build, constants)
    assert ast.literal_eval(build.args[0]) == "sluice"
    assert (ROOT / args["dockerfile"]).is_file()
    assert args["target"] == "dev"
    assert args["entrypoint"] == ["sluice"]
    assert "FROM runtime AS dev" in (ROOT / args["dockerfile"]).read_text()
    (sync,) = calls(tree, "sync")
    src, dest = (literal(a, constants) for a in sync.args)
    assert (ROOT / src / "__init__.py").is_file()
    # The venv the Dockerfile builds, for the Python the image runs.
    assert dest == "/opt/sluice/lib/python3.11/site-packages/sluice"
    dockerfile = (ROOT / args["dockerfile"]).read_text()
    assert "python -m venv /opt/sluice" in dockerfile
    assert "python:3.11-slim" in dockerfile


def test_chart_and_resources_match_what_the_chart_renders(tilt: tuple[ast.Module, dict[str, Any]]) -> None:
    tree, constants = tilt
    (helm_call,) = calls(tree, "helm")
    args = kwargs(helm_call, constants)
    assert ROOT / ast.literal_eval(helm_call.args[0]) == CHART
    (values,) = args["values"]
    assert (ROOT / values).is_file()
    workloads = {
        m["metadata"]["name"]
        for m in render([ROOT / values], release=args["name"])
        if m["kind"] in ("Deployment", "StatefulSet")
    }
    resources = {ast.literal_eval(c.args[0]) for c in calls(tree, "k8s_resource")}
    assert resources == workloads
    dev = render([ROOT / values], release=args["name"])
    assert not [m for m in dev if m["kind"] == "Pod"], "dev values must not render the helm test pod"


def test_port_forwards_cover_the_coordinator_and_metrics(tilt: tuple[ast.Module, dict[str, Any]]) -> None:
    tree, _ = tilt
    forwards = {ast.literal_eval(c.args[0]) for c in calls(tree, "port_forward")}
    assert {7600, 9600, 9601, 9602, 9603, 9604} <= forwards
    # Clients reach brokers at their advertised in-cluster names, so forwarding a broker's gRPC (7601)
    # or wire (7611) port to localhost would not help them; the chart exposes both in the cluster.
    assert not forwards & {7601, 7611}
    # Push consumers likewise stream from a dispatcher's wire port (7613) at the in-cluster name it
    # advertises.
    assert 7613 not in forwards


def test_protos_are_regenerated_when_proto_changes(tilt: tuple[ast.Module, dict[str, Any]]) -> None:
    tree, constants = tilt
    protos = [c for c in calls(tree, "local_resource") if ast.literal_eval(c.args[0]) == "protos"]
    (call,) = protos
    args = kwargs(call, constants)
    assert args["cmd"] == "make protos"
    assert args["deps"] == ["proto"]
    assert (ROOT / "proto").is_dir()
    assert "\nprotos:" in (ROOT / "Makefile").read_text()
