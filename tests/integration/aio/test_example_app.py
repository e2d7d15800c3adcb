"""examples/aio_web_app.py runs as a user would run it, against a real stack: orders POSTed over HTTP are
produced, the background consumer processes each once, and a SIGTERM stops it cleanly after its commits."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from sluice import Client
from tests.harness import ROOT, _env
from tests.integration.aio.conftest import Stack, name

APP = ROOT / "examples" / "aio_web_app.py"


def request(url: str, body: object | None = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_example_app_produces_on_post_and_consumes_in_the_background(stack: Stack) -> None:
    topic, group = name("orders"), name("order-service")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(APP),
            "--bootstrap",
            stack.bootstrap,
            "--port",
            "0",
            "--topic",
            topic,
            "--group",
            group,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # bounded: the process prints it, or exits and closes stdout
        match = re.match(r"listening on (http://\S+)", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        base = match.group(1)
        created = [request(f"{base}/orders", {"id": f"o-{i}", "amount": i}) for i in range(5)]
        assert all(status == 201 for status, _ in created), created
        assert request(f"{base}/orders", {"amount": 1})[0] == 400
        deadline = time.monotonic() + 20
        while True:
            _status, done = request(f"{base}/orders/processed")
            if isinstance(done, list) and len(done) >= 5:
                break
            assert time.monotonic() < deadline, done
            time.sleep(0.1)
        assert sorted(done) == [f"o-{i}" for i in range(5)]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    with Client(stack.bootstrap, request_timeout=10) as client:
        assert sum(client.admin.group_offsets(group).values()) == 5  # every order processed and committed
