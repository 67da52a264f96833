#!/usr/bin/env bash
# A Debian bookworm base image with python3 and venv, made from Debian's packages with
# debootstrap, for hosts that cannot pull python:3.11-slim-bookworm (no registry access):
#
#   deploy/docker/base-image.sh [TAG]        # default tdreplay-base:bookworm
#   make image BASE_IMAGE=tdreplay-base:bookworm
#
# Built once: an image already tagged TAG is kept (remove it to rebuild). Needs root (or sudo),
# debootstrap and a Debian mirror (MIRROR, default http://deb.debian.org/debian). Debian 12's
# Python is 3.11.2, so redis-py needs async-timeout: the Makefile puts it in the wheelhouse.
set -euo pipefail
TAG="${1:-tdreplay-base:bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
DOCKER="${DOCKER:-docker}"
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)

if $DOCKER image inspect "$TAG" >/dev/null 2>&1; then
  echo "base image $TAG is already built (docker rmi $TAG to rebuild)"
  exit 0
fi
command -v debootstrap >/dev/null 2>&1 || command -v /usr/sbin/debootstrap >/dev/null 2>&1 || {
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq debootstrap; }

rootfs=$(mktemp -d "${TMPDIR:-/tmp}/tdreplay-base.XXXXXX")
trap '$SUDO rm -rf "$rootfs"' EXIT
$SUDO /usr/sbin/debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$rootfs" "$MIRROR"
# what an image does not need: apt's lists and caches, docs, man pages, bytecode caches
$SUDO rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
  "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* \
  "$rootfs"/usr/share/info/* "$rootfs"/var/log/*.log
$SUDO find "$rootfs"/usr/lib/python3* -name __pycache__ -prune -exec rm -rf {} +
# apt inside a build (with --network host) finds the mirror the root filesystem came from
echo "deb $MIRROR bookworm main" | $SUDO tee "$rootfs"/etc/apt/sources.list >/dev/null
$SUDO tar -C "$rootfs" -c . | $DOCKER import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' - "$TAG"
echo "built base image $TAG"
