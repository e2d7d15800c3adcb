"""The chart README's parameter table is generated from values.yaml's `## @param` comments, and agrees."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from tests.chart.chartlib import CHART


def load_params() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sluice_chart_params", CHART / "hack" / "params.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


params = load_params()


def test_readme_table_is_in_sync_with_values() -> None:
    readme = (CHART / "README.md").read_text()
    generated = params.splice(readme, params.tables((CHART / "values.yaml").read_text()))
    assert generated == readme, "charts/sluice/README.md is stale: run `python charts/sluice/hack/params.py`"
    assert params.main(["--check"]) == 0


def test_every_value_is_documented() -> None:
    text = (CHART / "values.yaml").read_text()
    params.check_coverage(params.yaml.safe_load(text), params.parse(text))


def test_an_undocumented_value_is_an_error() -> None:
    text = "## @section S\n## @param a.b Documented\na:\n  b: 1\n  c: 2\n"
    with pytest.raises(params.ParamsError, match=r"a\.c has no ## @param"):
        params.tables(text)


def test_a_param_for_a_missing_value_is_an_error() -> None:
    text = "## @param a.x Gone\na:\n  b: 1\n"
    with pytest.raises(params.ParamsError, match=r"@param a\.x names no value"):
        params.tables(text)


def test_a_changed_default_makes_the_readme_stale() -> None:
    text = (CHART / "values.yaml").read_text().replace("replicas: 3", "replicas: 5", 1)
    readme = (CHART / "README.md").read_text()
    assert params.splice(readme, params.tables(text)) != readme


def test_objects_are_documented_whole_and_shown_as_json() -> None:
    text = "## @param r Resources\nr:\n  requests: {cpu: 1}\n"
    assert '| `r` | Resources | `{"requests": {"cpu": 1}}` |' in params.tables(text)
