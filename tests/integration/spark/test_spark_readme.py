"""deploy/spark/README.md's local commands run exactly as written (issue 18: they failed without
PYSPARK_PYTHON): every command of its first sh block, with only the addresses and paths swapped for
this test's, in an environment without PYSPARK_PYTHON and without the venv on PATH (so Spark's default
worker, `python3` from PATH, would be the system's)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

from sluice.client.client import Client
from tests.harness import ROOT

from .conftest import SPARK_JAVA_OPTS, Stack

README = ROOT / "deploy" / "spark" / "README.md"


def readme_commands() -> list[list[str]]:
    """Every command of the README's first sh block, continuation lines joined."""
    block = re.search(r"```sh\n(.*?)```", README.read_text(), flags=re.S)
    assert block
    return [shlex.split(line) for line in block.group(1).replace("\\\n", " ").splitlines() if line.strip()]


def test_the_readme_commands_run_as_written(stack: Stack, client: Client, tmp_path: Path) -> None:
    commands = readme_commands()
    assert [argv[:2] for argv in commands] == [
        [".venv/bin/python", "spark-jobs/export.py"],
        [".venv/bin/python", "spark-jobs/tag_counts.py"],
    ]
    topic = f"readme-{uuid.uuid4().hex[:8]}"
    client.admin.create_topic(topic, partitions=2)
    with client.producer(topic) as producer:
        for i in range(20):
            producer.send(f"v{i}".encode(), tag="tagA" if i % 2 else "tagB")
        producer.flush()
    swap = {
        "127.0.0.1:7600": stack.bootstrap,
        "orders": topic,
        "/tmp/orders_export": str(tmp_path / "out"),
        "/tmp/tag_counts": str(tmp_path / "counts"),
        "/tmp/tag_counts_ckpt": str(tmp_path / "ckpt"),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "PYTHONPATH", "VIRTUAL_ENV"))}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    # Speed only (the command and its environment are otherwise as the README says): this JVM lives
    # ~20 s for a 20-record export, so the client compiler and the serial GC win over C2 and G1 on 2 cores.
    env["JDK_JAVA_OPTIONS"] = SPARK_JAVA_OPTS
    for argv in commands:
        assert all(a in swap for a in argv if a.startswith("/tmp/") or a == "127.0.0.1:7600"), argv
        run = [sys.executable, *(swap.get(a, a) for a in argv[1:])]
        result = subprocess.run(
            run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert result.returncode == 0, (argv, result.stderr[-3000:])
    assert any(p.name.startswith("date=") for p in (tmp_path / "out").iterdir())
    # The streaming job read the topic to its end (--available-now) and checkpointed that batch.
    assert list((tmp_path / "ckpt" / "commits").iterdir()), "tag_counts committed no micro-batch"
