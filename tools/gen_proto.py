"""Generate the Python gRPC stubs of proto/ (``make proto``; ``make install`` runs it too).

    python -m tools.gen_proto              # writes triton_llm/v1/llm_service_pb2{.py,.pyi,_grpc.py}
    python -m tools.gen_proto --out DIR    # the same files under DIR/triton_llm/v1/ (the staleness test)
    python -m tools.gen_proto --check      # exit 1 if the committed stubs differ from fresh ones

``proto/`` is the include root, so the file ``proto/triton_llm/v1/llm_service.proto`` is the proto
package ``triton_llm.v1`` and protoc's Python output imports it absolutely as ``triton_llm.v1``. The
stubs therefore live in the top-level package ``triton_llm/`` at the repository root (listed in
pyproject.toml's packages), whose ``__init__.py`` files are hand-written; only the generated modules
are rewritten. The generator is ``grpcio-tools`` (pinned in requirements.txt so the output is stable).
"""
from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO / "proto"
PROTOS = ("triton_llm/v1/llm_service.proto",)
GENERATED = ("triton_llm/v1/llm_service_pb2.py", "triton_llm/v1/llm_service_pb2.pyi",
             "triton_llm/v1/llm_service_pb2_grpc.py")


def generate(out: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) on PROTOS, writing the Python stubs under ``out``."""
    import grpc_tools
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    well_known = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/*.proto
    args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={out}",
            f"--pyi_out={out}", f"--grpc_python_out={out}", *PROTOS]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}: {' '.join(args)}")
    return [out / g for g in GENERATED]


def stale_files(root: Path = REPO) -> list[str]:
    """Generated files under ``root`` that are missing or differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        return [g for g in GENERATED
                if not (root / g).is_file() or not filecmp.cmp(Path(tmp) / g, root / g, shallow=False)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO, help="output root (default: the repository root)")
    ap.add_argument("--check", action="store_true", help="only check that the committed stubs are fresh")
    args = ap.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print(f"stale generated stubs (run `make proto`): {', '.join(stale)}", file=sys.stderr)
            return 1
        print("generated stubs are up to date")
        return 0
    for path in generate(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
