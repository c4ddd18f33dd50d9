# syntax=docker/dockerfile:1
# The triton-llm serving image: NGC tritonserver 24.10 (Triton 2.51, the version the tests run against)
# with our packages, the model repository and the demo models. docs/deploy.md has the details.
#
#   docker build -t REGISTRY/triton-llm:0.1.0 .                                 # CUDA (torch cu128 build)
#   docker build --build-arg VARIANT=cpu -t REGISTRY/triton-llm:0.1.0-cpu .     # CPU-only torch, dev clusters
#
# The entrypoint is the launcher (python -m cli.serve): ports from HTTP_PORT / GRPC_PORT / METRICS_PORT,
# model repository overrides from TRITON_LLM_SET, extra tritonserver arguments from TRITON_LLM_SERVER_ARGS,
# OTEL_EXPORTER_OTLP_ENDPOINT passed through. Runs as uid 10001; every path it writes is listed in ENV below
# (the Helm chart mounts emptyDir volumes there and keeps the root filesystem read-only).
ARG BASE_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3
FROM ${BASE_IMAGE}

# cuda: torch from TORCH_CUDA_INDEX (CUDA 12.8 wheels: driver >= 570, or 525+ through CUDA minor
# version compatibility); cpu: torch from TORCH_CPU_INDEX, no CUDA libraries in the Python layer.
ARG VARIANT=cuda
ARG TORCH_CUDA_INDEX=https://download.pytorch.org/whl/cu128
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ARG APP_UID=10001

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# tini: PID 1 that forwards SIGTERM to the launcher (which drains tritonserver) and reaps orphans.
# gcc, libc6-dev, python3-dev: OpenAI Triton compiles its kernel launcher with them at first use.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini gcc libc6-dev python3-dev \
    && rm -rf /var/lib/apt/lists/* \
    && { command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python; }

# Dependencies first (a layer that survives code changes). torch's version comes from constraints.txt;
# the rest is requirements.txt without test-only packages (nvidia-pytriton: the image has tritonserver),
# under constraints.txt and helm/image-constraints.txt (the versions the tests passed with).
COPY requirements.txt constraints.txt helm/image-constraints.txt /tmp/requirements/
RUN set -eux; \
    cd /tmp/requirements; \
    case "$VARIANT" in \
      cuda) index="$TORCH_CUDA_INDEX" ;; \
      cpu) index="$TORCH_CPU_INDEX" ;; \
      *) echo "VARIANT must be cuda or cpu, got '$VARIANT'" >&2; exit 1 ;; \
    esac; \
    torch_spec="$(grep -E '^torch==' constraints.txt)"; \
    python3 -m pip install --upgrade pip; \
    python3 -m pip install "$torch_spec" --index-url "$index"; \
    grep -vE '^(nvidia-pytriton|pytest|pytest-timeout|hypothesis|matplotlib|kubernetes-validate)([^A-Za-z0-9_.-]|$)' \
        requirements.txt > runtime.txt; \
    python3 -m pip install -r runtime.txt -c constraints.txt -c image-constraints.txt; \
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; \
    if [ "$VARIANT" = cpu ]; then python3 -c "import torch; assert torch.version.cuda is None, torch.__version__"; fi; \
    rm -rf /tmp/requirements

# The code, the model repository and the demo checkpoints (.dockerignore keeps the rest out), owned by
# root and read-only to the server. A .pth file puts the repository on the system interpreter's path,
# as `pip install -e .` does for make serve: the Python backend's stub runs an isolated interpreter that
# ignores PYTHONPATH, and the models resolve relative paths (models/demo-target) from the packages' folder.
WORKDIR /opt/triton-llm
COPY . /opt/triton-llm
RUN set -eux; \
    echo /opt/triton-llm > "$(python3 -c 'import site; print(site.getsitepackages()[0])')/triton-llm.pth"; \
    python3 -m compileall -q -x '/(\.cache|models)/' /opt/triton-llm; \
    python3 -c "import cli.serve, backend, preprocess, postprocess"; \
    groupadd --gid "$APP_UID" triton-llm; \
    useradd --uid "$APP_UID" --gid "$APP_UID" --home-dir /home/triton-llm --create-home --shell /usr/sbin/nologin triton-llm; \
    mkdir -p /opt/triton-llm/.cache /home/triton-llm/.cache; \
    chown "$APP_UID:$APP_UID" /opt/triton-llm/.cache /home/triton-llm/.cache

# Written at run time: /tmp; /home/triton-llm/.cache (OpenAI Triton's kernel cache, torch inductor);
# /opt/triton-llm/.cache (the model repository rendered with TRITON_LLM_SET overrides).
ENV HOME=/home/triton-llm \
    XDG_CACHE_HOME=/home/triton-llm/.cache \
    TRITON_HOME=/home/triton-llm/.cache \
    TRITON_CACHE_DIR=/home/triton-llm/.cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/home/triton-llm/.cache/torchinductor \
    HF_HUB_OFFLINE=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HTTP_PORT=8000 \
    GRPC_PORT=8001 \
    METRICS_PORT=8002

USER ${APP_UID}:${APP_UID}
EXPOSE 8000 8001 8002
# NVIDIA's entrypoint (driver checks, banner) execs tini, which runs the launcher.
ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh", "/usr/bin/tini", "--", "python3", "-m", "cli.serve"]
CMD []
