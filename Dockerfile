# tdreplay server: `docker build -t tdreplay .` then, with the bearer token in a file,
#   docker run -p 8000:8000 -v "$PWD/secrets/tdreplay_token:/run/secrets/tdreplay_token:ro" \
#     -e TDREPLAY_TOKEN_FILE=/run/secrets/tdreplay_token -v tdreplay-data:/data tdreplay
# or with it in your environment (`-e NAME` alone copies it, keeping it off the command line):
#   export TDREPLAY_TOKEN=$(openssl rand -hex 32); docker run -p 8000:8000 -e TDREPLAY_TOKEN ... tdreplay
# The server binds 0.0.0.0 in the container, so it refuses to start without a token
# (--insecure overrides that; see SECURITY.md). It serves every schema in /schemas (the
# repository's by default; mount your own there) with data, checkpoints and exports under /data.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src

# torch first, from the CPU index: the default wheel pulls gigabytes of CUDA libraries
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch>=2.5"

# then tdreplay (its torch requirement is already met)
COPY pyproject.toml README.md ./
COPY codec codec
COPY storage storage
COPY service service
COPY client client
RUN pip install . && rm -rf /src/build

COPY schemas /schemas
RUN useradd --create-home --uid 10001 tdreplay \
    && mkdir -p /data \
    && chown -R tdreplay /data /schemas
USER tdreplay
WORKDIR /home/tdreplay

# Every flag of `tdreplay serve` has a TDREPLAY_* twin; these are the image's defaults.
# The token has none here: give TDREPLAY_TOKEN or TDREPLAY_TOKEN_FILE at run time.
# The malloc thresholds keep large request bodies off fresh mmaps (steady throughput).
ENV TDREPLAY_SCHEMA=/schemas \
    TDREPLAY_ROOT=/data \
    TDREPLAY_HOST=0.0.0.0 \
    TDREPLAY_PORT=8000 \
    TDREPLAY_RESTORE=true \
    TDREPLAY_CHECKPOINT_ON_SHUTDOWN=true \
    TDREPLAY_CHECKPOINT_EVERY=300 \
    MALLOC_MMAP_THRESHOLD_=33554432 \
    MALLOC_TRIM_THRESHOLD_=268435456

VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('TDREPLAY_PORT', '8000'), timeout=2)"]

# SIGTERM (docker stop) shuts down gracefully: running requests finish, tables close
# (and are checkpointed first with TDREPLAY_CHECKPOINT_ON_SHUTDOWN=true).
STOPSIGNAL SIGTERM
ENTRYPOINT ["tdreplay"]
CMD ["serve", "--host", "0.0.0.0"]
