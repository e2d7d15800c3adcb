"""``sluice up --auth``'s files: the cluster token and the admin's password, private and kept across
restarts; the flags every service gets; the banner."""

from __future__ import annotations

import base64
from pathlib import Path

from sluice.cli.up_auth import LocalAuth


def test_the_cluster_token_is_32_random_bytes_private_and_kept(tmp_path: Path) -> None:
    first = LocalAuth(tmp_path)
    assert len(base64.b64decode(first.cluster_token)) == 32
    assert oct(first.token_file.stat().st_mode & 0o777) == "0o600"
    assert LocalAuth(tmp_path).cluster_token == first.cluster_token
    (tmp_path / "other").mkdir()
    other = LocalAuth(tmp_path / "other")
    assert other.cluster_token != first.cluster_token


def test_a_token_file_left_readable_is_made_private_again(tmp_path: Path) -> None:
    LocalAuth(tmp_path).token_file.chmod(0o644)
    assert oct(LocalAuth(tmp_path).token_file.stat().st_mode & 0o777) == "0o600"


def test_every_service_gets_scram_acls_the_super_user_and_the_token(tmp_path: Path) -> None:
    auth = LocalAuth(tmp_path)
    args = auth.service_args()
    assert args[args.index("--auth-mechanisms") + 1] == "scram"
    assert args[args.index("--authorization") + 1] == "acl"
    assert args[args.index("--super-users") + 1] == "admin"
    assert args[args.index("--cluster-token-file") + 1] == str(auth.token_file)
    assert "--allow-anonymous" not in args


def test_the_banner_says_how_to_connect(tmp_path: Path) -> None:
    auth = LocalAuth(tmp_path)
    plain = "\n".join(auth.banner(None))
    assert f"export SLUICE_USERNAME=admin SLUICE_PASSWORD=$(cat {auth.password_file})" in plain
    assert "SLUICE_TLS_CA" not in plain
    assert "SLUICE_TLS_CA=/d/ca.crt" in "\n".join(auth.banner(Path("/d/ca.crt")))
