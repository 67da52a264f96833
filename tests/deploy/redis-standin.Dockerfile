# A stand-in for the official Redis image where no registry is reachable: Debian's redis-server
# on the debootstrap base (make base-image), with the official image's user (redis, uid 999) and
# data folder (/data). Built with `docker build --network host` (apt-get needs the mirror).
ARG BASE_IMAGE=tdreplay-base:bookworm
FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN groupadd --system --gid 999 redis \
    && useradd --system --uid 999 --gid 999 --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin redis \
    && apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown 999:999 /data
WORKDIR /data
VOLUME ["/data"]
USER 999:999
CMD ["redis-server"]
