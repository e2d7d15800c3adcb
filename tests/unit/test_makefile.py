"""The Makefile stays true: every declared target has a rule, help and only paths that exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = (ROOT / "Makefile").read_text()


def _phony_targets() -> list[str]:
    match = re.search(r"^\.PHONY:(.*)$", MAKEFILE, re.MULTILINE)
    assert match, "the Makefile declares its targets in .PHONY"
    return match.group(1).split()


def _recipe(target: str) -> list[str]:
    """The recipe lines of `target` (tab-indented lines after its rule line)."""
    lines = MAKEFILE.splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"^{re.escape(target)}:(?!=)", line):
            recipe = []
            for body in lines[i + 1 :]:
                if not body.startswith("\t"):
                    break
                recipe.append(body.strip())
            return recipe
    raise AssertionError(f"target {target!r} is declared .PHONY but has no rule")


def test_every_target_has_a_rule_and_a_help_line() -> None:
    for target in _phony_targets():
        rule = next(line for line in MAKEFILE.splitlines() if line.startswith(f"{target}:"))
        prerequisites = rule.split(":", 1)[1].strip()
        assert prerequisites or _recipe(target), f"make {target} does nothing"
        if target != "all":
            assert f"## {target}:" in MAKEFILE, f"make help does not describe {target}"


def test_every_path_a_recipe_names_exists() -> None:
    for target in _phony_targets():
        for line in _recipe(target):
            for path in re.findall(r"\b((?:bench|scripts|tests)/[\w./-]+)", line):
                assert (ROOT / path).exists(), f"make {target} runs {path}, which does not exist"


def test_make_help_lists_the_targets() -> None:
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for target in _phony_targets():
        if target != "all":
            assert re.search(rf"^\s+{re.escape(target)}:", out, re.MULTILINE), target
