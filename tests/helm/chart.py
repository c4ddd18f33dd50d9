"""Helpers for the chart tests: find helm, render the chart, validate manifests offline, search the sources."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from tools.fetch_helm import find_helm

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "triton-llm"
CI_VALUES = CHART / "ci"
# The Kubernetes version the manifests are rendered for and validated against: the oldest the chart
# supports in practice (gRPC probes are GA since 1.27; 1.30 is the oldest minor still in the major
# clouds' standard support). kubernetes-validate must ship its schemas (tests check, with a message).
K8S_VERSION = "1.30.0"
RELEASE = "llm"


@lru_cache(maxsize=1)
def helm() -> str:
    """The helm binary; fails (never skips) with what to do when there is none."""
    found = find_helm()
    if found is None:
        pytest.fail("helm 3 not found: neither `helm` on PATH nor .cache/helm/helm. Run `make test` "
                    "(it runs python -m tools.fetch_helm), or install helm 3 and put it on PATH.", pytrace=False)
    return str(found)


def run_helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120, check=False)


@lru_cache(maxsize=64)
def _render(values_files: tuple[str, ...], sets: tuple[str, ...]) -> str:
    args = ["template", RELEASE, str(CHART), "--namespace", "serving", "--kube-version", K8S_VERSION]
    for f in values_files:
        args += ["-f", f]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(*args)
    if proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc.stdout


def render(*values: str, sets: tuple[str, ...] = ()) -> list[dict]:
    """The rendered manifests; ``values`` are names under ci/ (``"pvc"`` -> ci/pvc-values.yaml) or paths."""
    files = tuple(str(CI_VALUES / f"{v}-values.yaml") if "/" not in v else v for v in values)
    return [d for d in yaml.safe_load_all(_render(files, tuple(sets))) if d]


def render_error(*sets: str, values_file: str | None = None) -> str:
    """stderr of a render that must fail."""
    args = ["template", RELEASE, str(CHART), "--kube-version", K8S_VERSION]
    if values_file:
        args += ["-f", values_file]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(*args)
    assert proc.returncode != 0, f"helm accepted {sets}:\n{proc.stdout[:2000]}"
    return proc.stderr


def check_inferencepool(doc: dict) -> None:
    """Raises ``jsonschema.ValidationError`` for an InferencePool that v1 does not admit (the schema in
    tests/helm/schemas/, written from the API reference; port numbers unique, which it cannot say)."""
    import jsonschema

    schema = json.loads((REPO / "tests" / "helm" / "schemas" / "inferencepool-v1.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    numbers = [p["number"] for p in doc["spec"]["targetPorts"]]
    if len(numbers) != len(set(numbers)):
        raise jsonschema.ValidationError(f"spec.targetPorts: port numbers must be unique, got {numbers}")


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}: {[d['kind'] for d in docs]}"
    return found[0]


def container(docs: list[dict], name: str) -> dict:
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    found = [c for c in spec["containers"] if c["name"] == name]
    assert found, f"no container {name!r}: {[c['name'] for c in spec['containers']]}"
    return found[0]


def env_of(c: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


# ---- the repository's Python sources (found by content, not by module path: modules move) ----------

def python_sources() -> list[Path]:
    """Every .py file of the repository but the tests, virtual environments and caches."""
    skip = {".venv", "venv", ".cache", ".git", "tests", "helm", "node_modules", "build", "__pycache__"}
    out = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
        out += [Path(root) / f for f in files if f.endswith(".py")]
    return sorted(out)


def files_with_string_literal(value: str) -> list[Path]:
    """Source files holding ``value`` as a whole string literal."""
    pattern = re.compile(r"""(["'])""" + re.escape(value) + r"\1")
    return [p for p in python_sources() if pattern.search(p.read_text(encoding="utf-8", errors="replace"))]


def dataclass_fields(class_name: str) -> tuple[Path, list[str]]:
    """The annotated fields of the one class ``class_name`` in the sources."""
    path, fields = dataclass_defaults(class_name)
    return path, list(fields)


def dataclass_defaults(class_name: str) -> tuple[Path, dict[str, object]]:
    """{field: default} of the one class ``class_name`` in the sources (a default that is not a literal,
    or none, is ``...``)."""
    found = []
    for p in python_sources():
        text = p.read_text(encoding="utf-8", errors="replace")
        if f"class {class_name}" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name == class_name:
                fields = {}
                for st in node.body:
                    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                        try:
                            fields[st.target.id] = ast.literal_eval(st.value) if st.value is not None else ...
                        except ValueError:
                            fields[st.target.id] = ...
                found.append((p, fields))
    assert len(found) == 1, f"expected one class {class_name} in the sources, found {[str(p) for p, _ in found]}"
    return found[0]


def dict_literal_keys(name: str) -> tuple[Path, list[str]]:
    """The keys of the module-level dict literal ``name = {...}`` in the sources."""
    found = []
    for p in python_sources():
        text = p.read_text(encoding="utf-8", errors="replace")
        if name not in text:
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and isinstance(node.value, ast.Dict):
                found.append((p, [k.value for k in node.value.keys if isinstance(k, ast.Constant)]))
    assert len(found) == 1, f"expected one dict literal {name} in the sources, found {[str(p) for p, _ in found]}"
    return found[0]
