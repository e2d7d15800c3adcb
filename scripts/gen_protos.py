"""Regenerate the protobuf and gRPC code in services/sluice/v1 from proto/.

One command (``make protos``) produces ``*_pb2.py``, ``*_pb2_grpc.py`` and
``*.pyi``. The output is committed; ``tests/unit/test_protos_fresh.py`` fails
when it is stale. The proto package path equals the Python import path
(``proto/sluice/v1/broker.proto`` -> ``sluice.v1.broker_pb2``), so no import
rewriting is needed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = Path("sluice") / "v1"


def generate(out_root: Path) -> list[Path]:
    """Generate code for every proto under proto/sluice/v1 into out_root."""
    protos = sorted((PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    (out_root / PACKAGE_DIR).mkdir(parents=True, exist_ok=True)
    bindir = Path(sys.executable).parent
    args = [
        "grpc_tools.protoc",
        f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    init = out_root / PACKAGE_DIR / "__init__.py"
    init.write_text('"""Generated protobuf code. Regenerate with `make protos`; do not edit."""\n')
    return sorted(p for p in (out_root / PACKAGE_DIR).iterdir() if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "services", help="source root to write into")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
        target = args.out / PACKAGE_DIR
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for f in files:
            shutil.copy2(f, target / f.name)
    print(f"generated {len(files)} files into {args.out / PACKAGE_DIR}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
