"""``python -m cli.liveness``: the Kubernetes liveness probe of the tritonserver container.

Reads the file the launcher's stub watch writes every poll (``cli/supervisor.py``; ``$TRITON_LLM_LIVENESS_FILE``,
default ``/tmp/triton-llm-liveness.json``) and exits 1, saying why, when:
- the file is missing or older than ``--max-age-s`` (the launcher's watch is not running or hangs);
- the state is ``failed`` (tritonserver did not become ready again after a restart);
- the state is ``serving`` and a stub it lists is dead (the same check as the watch's: the watch has not
  acted on it).
While the launcher starts or restarts tritonserver the probe passes, so a model that takes minutes to load
is not killed for it; the startup probe and readiness cover that time.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cli.stub_watch import PROC, alive
from cli.supervisor import liveness_path_from_env

DEFAULT_MAX_AGE_S = 10.0


def check(path: Path, max_age_s: float = DEFAULT_MAX_AGE_S, *, now: float | None = None,
          proc: Path = PROC) -> str | None:
    """Why the container is not alive, or None."""
    try:
        state = json.loads(path.read_text())
    except OSError as e:
        return f"{path}: cannot read the launcher's liveness file ({e.strerror or e})"
    except ValueError:
        return f"{path}: not JSON"
    now = time.time() if now is None else now
    age = now - float(state.get("at", 0))
    if age > max_age_s:
        return f"the launcher's stub watch last reported {age:.0f} s ago (limit {max_age_s:g} s)"
    if state.get("state") == "failed":
        return f"tritonserver could not be restarted: {state.get('reason', '')}"
    if state.get("state") == "serving":
        dead = [pid for pid in state.get("stubs", []) if not alive(int(pid), proc)]
        if dead:
            return f"Python stub(s) {dead} of tritonserver pid {state.get('server_pid')} are dead"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", type=Path, default=None, help="the liveness file (default $TRITON_LLM_LIVENESS_FILE "
                                                            "or /tmp/triton-llm-liveness.json)")
    ap.add_argument("--max-age-s", type=float, default=DEFAULT_MAX_AGE_S)
    args = ap.parse_args(argv)
    reason = check(args.file or liveness_path_from_env(), args.max_age_s)
    if reason is not None:
        print(f"not alive: {reason}", file=sys.stderr)
        return 1
    print("alive")
    return 0


if __name__ == "__main__":
    sys.exit(main())
