# tdreplay server image. Build it with `make image`: the Makefile prepares every wheel on the
# host (deploy/docker/wheels: torch pinned, the CPU build from PyTorch's CPU index where it is
# reachable), so nothing inside the build needs the network. A CUDA build:
#   make image TORCH_INDEX=https://download.pytorch.org/whl/cu128 IMAGE=tdreplay:cuda
# (the CUDA wheels bring their own CUDA runtime: the host needs only the NVIDIA driver and
# container toolkit, and `docker run --gpus all`). BASE_IMAGE is any Debian-like image with
# python3 (3.11) and its venv module: the slim Python image by default, or a Debian base made
# with debootstrap where no registry is reachable (`make base-image`).
#
# Run it with its token in a file (a Docker secret, or a mounted file), never on a command line:
#   docker run -p 127.0.0.1:8000:8000 -v tdreplay-data:/data -v tdreplay-run:/run/tdreplay \
#     -v "$PWD/secrets/tdreplay_token:/run/secrets/tdreplay_token:ro" --stop-timeout 60 tdreplay
# The server binds 0.0.0.0 in the container, so it refuses to start without a token
# (--insecure overrides that; see SECURITY.md). It serves every schema in /schemas (the shipped
# ones by default; mount your own there), with tables, checkpoints and exports in the /data
# volume: memmap tables reopen from their own files, the others are checkpointed every 5 minutes
# and on stop and restored on start, so a restarted container keeps its tables. The root
# filesystem may be read-only (`--read-only`): the server writes only to /data and /run/tdreplay,
# and to /tmp if one is mounted (`--tmpfs /tmp`), else its temporary files go to /data/.tmp.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---- build: a venv from the host's wheels; only the venv goes on ------------------------------
FROM ${BASE_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INDEX=1 \
    PIP_FIND_LINKS=/wheels
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# the dependencies first (a layer that changes only with the wheelhouse), every one at the
# version it was tested with; the wheelhouse stays in this stage. Not for serving, so not in the
# image (~220 MB): torch's headers, CMake files and C++ test programs (torch_shm_manager stays),
# and the test suites of pandas, sympy, numpy, networkx and pyarrow.
COPY deploy/docker/wheels /wheels
COPY deploy/docker/constraints.txt /tmp/constraints.txt
RUN python3 -m venv /opt/tdreplay \
    && /opt/tdreplay/bin/pip install --constraint /tmp/constraints.txt \
       "torch==${TORCH_VERSION}" /wheels/*.whl \
    && site=$(echo /opt/tdreplay/lib/python3*/site-packages) \
    && rm -rf "$site"/torch/include "$site"/torch/share/cmake "$site"/torch/bin/protoc* \
              "$site"/torch/bin/test_* "$site"/torch/bin/*Test \
    && find "$site"/pandas "$site"/sympy "$site"/numpy "$site"/networkx "$site"/pyarrow \
            -depth -type d -name tests -exec rm -rf {} +

# then tdreplay itself, from this source tree
WORKDIR /src
COPY pyproject.toml README.md ./
COPY codec codec
COPY system system
COPY cli cli
COPY storage storage
COPY service service
COPY client client
COPY schemas schemas
COPY adapters adapters
RUN /opt/tdreplay/bin/pip install --no-deps . \
    && /opt/tdreplay/bin/pip check

# ---- the image: the base, the venv, a numeric user ---------------------------------------------
FROM ${BASE_IMAGE}
COPY --from=build /opt/tdreplay /opt/tdreplay

# A numeric user, so `--user 10001` in a learner container matches it (the same-host socket
# folder admits only the server's user). /run/tdreplay holds that socket: mount it as a volume
# in the learner containers too.
COPY schemas /schemas
RUN groupadd --gid 10001 tdreplay \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin tdreplay \
    && mkdir -p /data /run/tdreplay \
    && chown 10001:10001 /data /run/tdreplay \
    && chmod 0700 /run/tdreplay
USER 10001:10001
WORKDIR /home/tdreplay

# Every flag of `tdreplay serve` has a TDREPLAY_* twin; these are the image's defaults.
# The token has none here: TDREPLAY_TOKEN_FILE names the Docker secret's file.
# The malloc thresholds keep large request bodies off fresh mmaps (steady throughput).
# TDREPLAY_TOKEN_FILE is a path, not a secret:
# hadolint ignore=DL3064
ENV PATH=/opt/tdreplay/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TDREPLAY_SCHEMA=/schemas \
    TDREPLAY_ROOT=/data \
    TDREPLAY_HOST=0.0.0.0 \
    TDREPLAY_PORT=8000 \
    TDREPLAY_TOKEN_FILE=/run/secrets/tdreplay_token \
    TDREPLAY_RESTORE=true \
    TDREPLAY_CHECKPOINT_ON_SHUTDOWN=true \
    TDREPLAY_CHECKPOINT_EVERY=300 \
    TDREPLAY_SHM_SOCKET=/run/tdreplay/tdreplay.sock \
    MALLOC_MMAP_THRESHOLD_=33554432 \
    MALLOC_TRIM_THRESHOLD_=268435456

VOLUME ["/data", "/run/tdreplay"]
EXPOSE 8000

# Ready means the tables are loaded (restored): /readyz answers 200 then, 503 before.
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('TDREPLAY_PORT', '8000'), timeout=2)"]

# SIGTERM (docker stop) shuts down gracefully: running requests finish, tables are
# checkpointed (TDREPLAY_CHECKPOINT_ON_SHUTDOWN) and closed. Give it time: --stop-timeout 60
# (an image cannot set it; Docker's 10 s were too few for 4.6 GB of memory tables).
STOPSIGNAL SIGTERM
ENTRYPOINT ["tdreplay"]
CMD ["serve"]
