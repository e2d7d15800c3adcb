"""Lint deploy/Dockerfile without a Docker engine: parse it and check what the chart relies on.

The chart runs the image with `args:` only (so ENTRYPOINT must be `sluice`), as UID 10001 with
runAsNonRoot (so USER must be numeric and non-root), with a read-only root filesystem (so bytecode is
compiled at build time and only /data and /tmp are written).
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field

import pytest
import yaml

from tests.chart.chartlib import CHART, ROOT

DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / "deploy" / "Dockerfile.dockerignore"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]


def instructions(text: str) -> list[tuple[str, str]]:
    """(OP, arguments) pairs, with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # comments may sit inside a continued RUN, as in Docker
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        op, _, args = pending.partition(" ")
        out.append((op.upper(), args.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for op, arg in instructions(text):
        if op == "ARG" and not stages:
            key, _, default = arg.partition("=")
            args[key] = default
        elif op == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", arg, flags=re.IGNORECASE)
            assert m, f"cannot parse FROM {arg}"
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda g: args[g.group(1) or g.group(2)], m.group(1))
            stages.append(Stage(m.group(2) or str(len(stages)), base))
        else:
            assert stages, f"{op} before the first FROM"
            stages[-1].instructions.append((op, arg))
    return args, stages


def effective(stages: list[Stage], stage: Stage, op: str) -> str | None:
    """The last `op` in a stage or, failing that, in the stage it was built FROM."""
    values = stage.all(op)
    if values:
        return values[-1]
    parent = next((s for s in stages if s.name == stage.base), None)
    return effective(stages, parent, op) if parent else None


def root_base(stages: list[Stage], stage: Stage) -> str:
    parent = next((s for s in stages if s.name == stage.base), None)
    return root_base(stages, parent) if parent else stage.base


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text())[1]


def test_multi_stage_build_on_python_311_slim(stages: list[Stage]) -> None:
    names = [s.name for s in stages]
    assert {"builder", "runtime"} <= set(names)
    for stage in stages:
        assert root_base(stages, stage) == "python:3.11-slim", stage.name
    runtime = next(s for s in stages if s.name == "runtime")
    assert any(c.startswith("--from=builder ") for c in runtime.all("COPY")), "runtime copies from builder"
    assert not any("pip install" in r for r in runtime.all("RUN")), "no build tools in the runtime stage"


def test_builder_installs_the_project_into_a_venv_with_the_generated_protos(stages: list[Stage]) -> None:
    builder = next(s for s in stages if s.name == "builder")
    runs = " ".join(builder.all("RUN"))
    assert "python -m venv /opt/sluice" in runs
    assert "/opt/sluice/bin/pip install --no-deps ." in runs
    assert "import sluice.v1.broker_pb2" in runs, "the build proves the generated protos are in the image"
    copied = [shlex.split(c)[:-1] for c in builder.all("COPY")]
    assert ["services"] in copied
    assert ["pyproject.toml"] in copied
    assert (ROOT / "services" / "sluice" / "v1" / "broker_pb2.py").is_file()


def test_the_image_installs_the_server_extra(stages: list[Stage]) -> None:
    """`pip install sluice` is the SDK only (docs/packaging.md); the image runs the services, so its
    dependency install must be `.[server]`, the extra that brings what the services import."""
    builder = next(s for s in stages if s.name == "builder")
    installs = [
        shlex.split(part.strip())
        for run in builder.all("RUN")
        for part in run.split("&&")
        if "pip install" in part and "--no-deps" not in part
    ]
    assert installs, "the builder installs no dependencies"
    assert all(words[-1] == ".[server]" for words in installs), installs
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["server"]
    names = {re.split(r"[\[<>=;! ]", req, maxsplit=1)[0] for req in extra}
    assert {"redis", "prometheus-client", "kubernetes", "grpcio-health-checking"} <= names


def test_final_image_runs_sluice_as_a_numeric_non_root_user(stages: list[Stage]) -> None:
    final = stages[-1]
    user = effective(stages, final, "USER")
    assert user is not None, "no USER: the image would run as root"
    uid, _, gid = user.partition(":")
    assert uid.isdigit(), f"USER {user} must be numeric, or runAsNonRoot cannot verify it"
    assert int(uid) != 0, f"USER {user} is root"
    assert gid == "" or (gid.isdigit() and int(gid) != 0)
    assert int(uid) == 10001, "the chart's podSecurityContext.runAsUser is 10001"
    entrypoint = effective(stages, final, "ENTRYPOINT")
    assert entrypoint is not None
    assert json.loads(entrypoint) == ["sluice"], "exec-form ENTRYPOINT so `args:` become sluice's arguments"
    env = " ".join(s for stage in stages if stage.name in ("runtime", final.name) for s in stage.all("ENV"))
    assert "PATH=/opt/sluice/bin:$PATH" in env
    assert effective(stages, final, "WORKDIR") == "/data"


def exposed(stages: list[Stage], stage: Stage) -> set[int]:
    """The ports a stage EXPOSEs, its own and those of the stages it was built FROM."""
    ports = {int(p.partition("/")[0]) for arg in stage.all("EXPOSE") for p in arg.split()}
    parent = next((s for s in stages if s.name == stage.base), None)
    return ports | exposed(stages, parent) if parent else ports


def test_image_exposes_every_port_the_chart_gives_a_sluice_service(stages: list[Stage]) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    sluice = {k: v for k, v in values["components"].items() if "metrics" in v}
    assert set(sluice) == {"broker", "coordinator", "offsetStore", "dispatcher", "scheduler"}
    # The scheduler serves no gRPC: only its metrics port.
    ports = {v["service"]["port"] for v in sluice.values() if "service" in v}
    ports |= {v["metrics"]["port"] for v in sluice.values()}
    ports |= {values["components"][name]["wire"]["port"] for name in ("broker", "dispatcher")}
    assert 7611 in ports, "the broker's wire port"
    assert 7613 in ports, "the dispatcher's wire port"
    for stage in (stages[-1], next(s for s in stages if s.name == "dev")):
        missing = ports - exposed(stages, stage)
        assert not missing, f"{stage.name} does not EXPOSE {sorted(missing)}"


def test_dev_stage_for_tilt_keeps_the_non_root_user(stages: list[Stage]) -> None:
    dev = next(s for s in stages if s.name == "dev")
    assert dev.base == "runtime"
    assert dev.all("USER")[-1] == "10001:10001"
    assert stages[-1].name != "dev", "a plain `docker build` must not produce the dev image"
    assert "target='dev'" in (ROOT / "Tiltfile").read_text()


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    decision = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern.lstrip("!").strip("/")
        regex = re.escape(body).replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, c) for c in candidates):
            decision = not negate
    return decision


def test_build_context_holds_only_what_the_build_needs() -> None:
    patterns = [
        ln.strip() for ln in DOCKERIGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")
    ]
    for needed in ("pyproject.toml", "services/sluice/__init__.py", "services/sluice/v1/broker_pb2.py"):
        assert not _ignored(needed, patterns), needed
    for unwanted in (
        ".venv/bin/python",
        ".git/HEAD",
        ".tools/bin/helm",
        "tests/harness.py",
        "services/sluice/__pycache__/errors.cpython-311.pyc",
        "charts/sluice/values.yaml",
    ):
        assert _ignored(unwanted, patterns), unwanted
    # Every COPY source from the context exists and survives the ignore file.
    _, stages = parse(DOCKERFILE.read_text())
    for stage in stages:
        for copy in stage.all("COPY"):
            words = shlex.split(copy)
            if any(w.startswith("--from=") for w in words):
                continue
            for src in words[:-1]:
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
                assert not _ignored(src, patterns), f"COPY {src}: excluded by {DOCKERIGNORE.name}"


def test_parser_sees_through_continuations_and_comments() -> None:
    text = "ARG B=python:3.11-slim\nFROM ${B} AS a\nRUN one \\\n    # note\n    && two\nUSER 5\nFROM a AS b\n"
    _, parsed = parse(text)
    assert [(s.name, s.base) for s in parsed] == [("a", "python:3.11-slim"), ("b", "a")]
    assert parsed[0].all("RUN") == ["one && two"]
    assert effective(parsed, parsed[1], "USER") == "5"
    assert _ignored("x/y", ["*"])
    assert not _ignored("x/y", ["*", "!x"])
