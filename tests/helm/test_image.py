"""The Dockerfile agrees with the chart and the repository (no Docker daemon here: the image itself is
built by the user; these are the checks that need no build)."""
from __future__ import annotations

import fnmatch
import re

import yaml

from tests.helm.chart import CHART, REPO, container, render

DOCKERFILE = (REPO / "Dockerfile").read_text()
DOCKERIGNORE = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def instructions(name: str) -> list[str]:
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    return [m.group(1).strip() for m in re.finditer(rf"^{name}\s+(.*)$", text, re.M)]


def env() -> dict[str, str]:
    out = {}
    for line in instructions("ENV"):
        out.update(dict(re.findall(r"(\w+)=(\S+)", line)))
    return out


def ignored(path: str) -> bool:
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in DOCKERIGNORE)


def test_base_image_is_the_triton_we_test_against():
    assert "ARG BASE_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3" in DOCKERFILE
    assert instructions("FROM") == ["${BASE_IMAGE}"]


def test_entrypoint_is_the_launcher_behind_an_init():
    [entrypoint] = instructions("ENTRYPOINT")
    assert entrypoint.endswith('"/usr/bin/tini", "--", "python3", "-m", "cli.serve"]')
    assert (REPO / "cli" / "serve.py").is_file()
    e = env()
    assert (e["HTTP_PORT"], e["GRPC_PORT"], e["METRICS_PORT"]) == ("8000", "8001", "8002")


def test_runs_as_the_chart_user():
    uid = re.search(r"^ARG APP_UID=(\d+)$", DOCKERFILE, re.M).group(1)
    assert instructions("USER") == ["${APP_UID}:${APP_UID}"]
    security = VALUES["podSecurityContext"]
    assert int(uid) == security["runAsUser"] == security["runAsGroup"] == security["fsGroup"] > 0


def test_every_path_the_image_writes_is_a_volume_in_the_chart():
    e = env()
    home, repo = e["HOME"], "/opt/triton-llm"
    assert "WORKDIR /opt/triton-llm" in DOCKERFILE
    written = {"/tmp", f"{home}/.cache", f"{repo}/.cache"}
    for key in ("XDG_CACHE_HOME", "TRITON_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        assert any(e[key] == w or e[key].startswith(w + "/") for w in written), (key, e[key])
    mounts = {m["mountPath"] for m in container(render(), "tritonserver")["volumeMounts"]}
    assert written <= mounts


def test_build_context_has_what_the_image_needs_and_not_the_rest():
    copied = [c for c in instructions("COPY")]
    sources = [s for c in copied for s in c.split()[:-1]]
    for src in sources:
        if src != ".":
            assert (REPO / src).is_file(), src
            assert not ignored(src), f"{src} is COPY'd but .dockerignore excludes it"
    for needed in ("model_repository/llm/config.pbtxt", "models/demo-target/config.json", "backend/__init__.py",
                   "preprocess/__init__.py", "postprocess/__init__.py", "cli/serve.py", "constraints.txt"):
        assert (REPO / needed).exists() and not ignored(needed), needed
    for excluded in (".venv", ".cache", ".git", "tests", "helm/triton-llm"):
        assert ignored(excluded), excluded


def test_torch_version_and_requirements_filter():
    constraints = (REPO / "constraints.txt").read_text()
    assert re.search(r"^torch==\S+$", constraints, re.M), "the Dockerfile reads torch's pin from constraints.txt"
    dev_only = re.search(r"grep -vE '\^\(([^)]*)\)", DOCKERFILE).group(1).split("|")
    requirements = {re.split(r"[\[<>=~! ]", line.strip(), maxsplit=1)[0].lower()
                    for line in (REPO / "requirements.txt").read_text().splitlines() if line.strip() and line[0] != "#"}
    assert set(dev_only) <= requirements, f"excluded but not required: {set(dev_only) - requirements}"
    assert "nvidia-pytriton" in dev_only  # the image has its own tritonserver
    pins = [line for line in (REPO / "helm" / "image-constraints.txt").read_text().splitlines()
            if line and line[0] != "#"]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9_.-]+==\S+", p) for p in pins)
    pinned = {p.split("==")[0].lower() for p in pins}
    assert not pinned & set(dev_only) and "torch" not in pinned
