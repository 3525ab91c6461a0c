#!/usr/bin/env bash
# Makes a Python base image for the Dockerfile from Debian packages, for machines that reach no image registry.
#
# Contract:
#   hack/base-image.sh           make sure the image $BASE_IMAGE_TAG (default mcad.local/python:3.11-slim-bookworm)
#                                is in the Docker engine, then print its name on stdout
#   hack/base-image.sh --print   print the name if the image is there or cached, without building (exit 1 if not)
# What it is: `debootstrap --variant=minbase bookworm` from the Debian mirror apt already uses, with python3,
# python3-venv and ca-certificates, then /usr/local made a virtual environment of Debian's Python 3.11. That gives
# the layout of the official python:3.11-slim image the Dockerfile is written for: `python3` and `pip` in
# /usr/local/bin, and `pip install --prefix=/install` writing /install/lib/python3.11/site-packages (Debian's own
# Python would write /install/local/lib/python3.11/dist-packages). Documentation, manual pages, locales and apt's
# lists are left out. The host's CA bundle replaces the image's, so pip inside `docker build` trusts what this
# machine trusts (a TLS-inspecting proxy's CA included): the image is for this machine, never pushed anywhere.
#
# The root filesystem is kept as a tarball in ${MCAD_DEV_CACHE:-~/.cache/mcad-dev}/base-image-<key>.tar.gz, keyed
# by this script, the suite and the host's CA bundle, so a new Docker engine (a fresh CI machine with a warm cache)
# imports it in seconds instead of running debootstrap again (2-4 minutes). Written to a temporary file and
# renamed, so an interrupted run never leaves a half-made entry. Needs root (debootstrap), docker, debootstrap.
set -euo pipefail

cache="${MCAD_DEV_CACHE:-$HOME/.cache/mcad-dev}"
tag="${BASE_IMAGE_TAG:-mcad.local/python:3.11-slim-bookworm}"
suite=bookworm
ca_bundle=/etc/ssl/certs/ca-certificates.crt
print_only=false
case "${1:-}" in
  "") ;;
  --print) print_only=true ;;
  *) printf '[base-image] error: unknown argument %s (expected --print)\n' "$1" >&2; exit 2 ;;
esac

log() { printf '[base-image] %s\n' "$*" >&2; }
die() { printf '[base-image] error: %s\n' "$*" >&2; exit 1; }

command -v docker >/dev/null 2>&1 || die "docker is not on PATH (Debian: apt-get install docker.io)"
docker info >/dev/null 2>&1 || die "the Docker engine does not answer ('docker info' failed): start dockerd (as root: dockerd &, or systemctl start docker)"

key_input() { cat "${BASH_SOURCE[0]}"; echo "$suite"; [[ -r $ca_bundle ]] && cat "$ca_bundle"; }
key=$(key_input | sha256sum | cut -c1-12)
tarball="$cache/base-image-$suite-$key.tar.gz"
# The image carries the key as a label: a tag left by an older version of this script is rebuilt, not reused.
label=dev.mcad.base-image-key

have_image() { [[ "$(docker image inspect -f "{{ index .Config.Labels \"$label\" }}" "$tag" 2>/dev/null)" == "$key" ]]; }

import_tarball() {
  log "importing $tarball as $tag"
  docker import \
    --change "LABEL $label=$key" \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$tarball" "$tag" >/dev/null
}

if have_image; then printf '%s\n' "$tag"; exit 0; fi
if $print_only; then
  [[ -f $tarball ]] || { log "not made yet: $tag (run hack/base-image.sh)"; exit 1; }
  import_tarball; printf '%s\n' "$tag"; exit 0
fi

if [[ ! -f $tarball ]]; then
  ((EUID == 0)) || die "debootstrap needs root (run as root, or with sudo)"
  command -v debootstrap >/dev/null 2>&1 || die "debootstrap is not installed (Debian: apt-get install debootstrap)"
  # The mirror apt already uses (deb822 sources or sources.list), else Debian's CDN.
  mirror=$(grep -hsE '^URIs:|^deb ' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
    grep -oE 'https?://[^ ]*/debian/?( |$)' | head -1 | tr -d ' ' || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  mkdir -p "$cache"
  work=$(mktemp -d "$cache/.base-image-XXXXXX")
  # The root filesystem is made by root and holds device nodes: removed whatever happens.
  trap 'rm -rf "$work"' EXIT
  root="$work/rootfs"
  log "debootstrap $suite (minbase + python3) from $mirror: 2-4 minutes"
  start=$SECONDS
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$suite" "$root" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
  log "debootstrap done in $((SECONDS - start)) s"
  [[ -r $ca_bundle ]] && cp "$ca_bundle" "$root/etc/ssl/certs/ca-certificates.crt"
  # /usr/local as a venv: the official image's layout (see the header). --copies is not used: the venv's python3
  # is a link to Debian's /usr/bin/python3.11, as the official image's is to its own build.
  chroot "$root" /usr/bin/python3 -m venv /usr/local >"$work/venv.log" 2>&1 ||
    { cat "$work/venv.log" >&2; die "making /usr/local a virtual environment failed"; }
  # pip inside the image uses the system CA bundle (the host's, above) rather than its bundled copy.
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$root/etc/pip.conf"
  rm -rf "$root"/usr/share/{doc,man,info,locale,lintian,linda}/* "$root"/var/lib/apt/lists/* \
    "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old "$root"/var/log/* "$root"/tmp/*
  find "$root/usr/lib/python3.11" -name __pycache__ -prune -exec rm -rf {} + 2>/dev/null || true
  tar -C "$root" --numeric-owner -czf "$work/rootfs.tar.gz" .
  mv "$work/rootfs.tar.gz" "$tarball"
  log "cached $tarball ($(du -m "$tarball" | cut -f1) MB)"
  # Older keys of this suite are of no use any more.
  find "$cache" -maxdepth 1 -name "base-image-$suite-*.tar.gz" ! -name "$(basename "$tarball")" -delete
fi
import_tarball
log "$tag: $(docker image inspect -f '{{ .Size }}' "$tag" | awk '{printf "%.0f MB", $1 / 1e6}')"
printf '%s\n' "$tag"
