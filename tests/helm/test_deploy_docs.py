"""docs/deploy.md lists every chart value with its default, and every engine key with its default."""
from __future__ import annotations

import json
import re

import yaml

from tests.helm.chart import CHART, REPO, dataclass_defaults, dict_literal_keys

DOC = (REPO / "docs" / "deploy.md").read_text()
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
ROW = re.compile(r"^\| `([^`]+)` \| (`[^`]*`|[^|]*?) \|", re.M)


def section(start: str, end: str | None) -> str:
    assert start in DOC, f"docs/deploy.md: no {start!r}"
    text = DOC.split(start, 1)[1]
    return text.split(end, 1)[0] if end else text


def flatten(values: dict, prefix: str = "") -> dict[str, object]:
    """Dotted keys to leaves; an empty map and a list are leaves."""
    out: dict[str, object] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def rows(text: str) -> dict[str, str]:
    found = ROW.findall(text)
    keys = [k for k, _ in found]
    assert len(keys) == len(set(keys)), f"duplicate rows: {sorted(k for k in keys if keys.count(k) > 1)}"
    return dict(found)


def test_value_table_matches_values_yaml():
    table = rows(section("## 8. Every value", "### `engine` keys"))
    expected = flatten(VALUES)
    assert list(table) == list(expected), (
        f"docs/deploy.md value table vs values.yaml: missing {sorted(set(expected) - set(table))}, "
        f"not in values.yaml {sorted(set(table) - set(expected))} (or out of order)")
    for key, cell in table.items():
        assert cell.startswith("`"), f"{key}: default not in backticks: {cell!r}"
        documented = yaml.safe_load(cell.strip("`"))
        assert documented == expected[key], f"{key}: docs/deploy.md says {cell}, values.yaml has {expected[key]!r}"


def pbtxt_parameters(model: str) -> dict[str, str]:
    text = (REPO / "model_repository" / model / "config.pbtxt").read_text()
    return dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', text))


def engine_setting_defaults() -> dict[str, object]:
    """{setting: default} over EngineConfig's groups (``...`` where a group has no literal default)."""
    from backend.config import GROUPS

    out: dict[str, object] = {}
    for cls in GROUPS.values():
        out.update(dataclass_defaults(cls.__name__)[1])
    return out


def test_engine_key_table_matches_the_schema_and_the_defaults():
    table = rows(section("### `engine` keys", "\n## "))
    assert set(table) == set(SCHEMA["properties"]["engine"]["properties"])
    pbtxt = pbtxt_parameters("llm")
    engine_defaults = engine_setting_defaults()
    for key, cell in table.items():
        if key in pbtxt:
            assert cell == f"`{pbtxt[key]}`", f"{key}: docs say {cell}, llm/config.pbtxt has {pbtxt[key]!r}"
        elif engine_defaults.get(key) not in (None, ...):
            assert yaml.safe_load(cell.strip("`")) == engine_defaults[key], f"{key}: docs say {cell}"
        else:
            assert not cell.startswith("`"), f"{key}: no fixed default, yet the docs give {cell}"
    _, serving = dict_literal_keys("SERVING_PARAMETERS")
    assert set(serving) <= set(table)


def test_engine_key_table_names_each_keys_group():
    """The last column: the EngineConfig group holding the key (as code reads it), or serving for the rest."""
    from backend.config import SETTING_GROUPS

    text = section("### `engine` keys", "\n## ")
    assert "| key | default | type | group |" in text
    for line in text.splitlines():
        if line.startswith("| `"):
            key, group = line.split("`")[1], line.rstrip(" |").rsplit("| ", 1)[1]
            assert group == (f"`{SETTING_GROUPS[key]}`" if key in SETTING_GROUPS else "serving"), f"{key}: {group}"


def test_docs_are_linked():
    readme = (REPO / "README.md").read_text()
    assert "docs/deploy.md" in readme and "`helm/`" in readme
    assert "deploy.md" in (REPO / "helm" / "README.md").read_text()
    assert "Not built yet" not in (REPO / "helm" / "README.md").read_text()
