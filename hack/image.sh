#!/usr/bin/env bash
# `make image`: the controller image from the Dockerfile, checked, tagged as the chart expects.
#
#   hack/image.sh            IMAGE (default ghcr.io/mcad-dev/mcad:<version of the package>) from BASE_IMAGE
#
# BASE_IMAGE (default python:3.11-slim, as users expect): used as it is when Docker has it or can pull it. When it
# is the default and cannot be pulled (no registry reachable), hack/base-image.sh makes an equivalent base from
# Debian packages and the build uses that; BASE_IMAGE=local asks for that base directly.
# After the build the image is checked: it runs as uid 65532, `mcad-controller --version` prints the package's
# version with a read-only root filesystem, and every mcad module imports (the Dockerfile leaves out parts of the
# dependencies that mcad does not import). Its size is printed last.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

log() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }

version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' mcad/__init__.py)
[[ -n $version ]] || die "no __version__ in mcad/__init__.py"
image=${IMAGE:-ghcr.io/mcad-dev/mcad:$version}
base=${BASE_IMAGE:-python:3.11-slim}

command -v docker >/dev/null 2>&1 || die "docker is not on PATH (Debian: apt-get install docker.io)"
docker info >/dev/null 2>&1 ||
  die "the Docker engine does not answer ('docker info' failed): start it (as root: dockerd >/var/log/dockerd.log 2>&1 &, or systemctl start docker)"

if [[ $base == local ]]; then
  base=$(hack/base-image.sh)
elif ! docker image inspect "$base" >/dev/null 2>&1; then
  log "pulling $base"
  if ! timeout 120 docker pull -q "$base" >/dev/null 2>&1; then
    [[ -z ${BASE_IMAGE:-} ]] ||
      die "cannot pull $base; build without a registry with BASE_IMAGE=local (hack/base-image.sh: Debian packages)"
    log "cannot pull $base (no registry reachable?): making an equivalent base from Debian packages (hack/base-image.sh)"
    base=$(hack/base-image.sh)
  fi
fi

log "building $image from $base"
start=$SECONDS
docker build --build-arg "BASE_IMAGE=$base" --tag "$image" . >&2 || die "docker build failed (output above)"
log "built in $((SECONDS - start)) s"

user=$(docker image inspect -f '{{ .Config.User }}' "$image")
[[ $user == 65532:65532 ]] || die "$image runs as '$user', not 65532:65532"
reported=$(docker run --rm --read-only "$image" --version) || die "$image --version failed"
[[ $reported == "mcad-controller, version $version" ]] || die "$image --version says '$reported', not $version"
# shellcheck disable=SC2016  # Python, not shell
docker run --rm --read-only --entrypoint python3 "$image" -c '
import importlib, pkgutil, mcad
names = [m.name for m in pkgutil.walk_packages(mcad.__path__, "mcad.")]
for name in names:
    importlib.import_module(name)
' || die "$image cannot import every mcad module (the traceback above names what is missing)"
size=$(docker image inspect -f '{{ .Size }}' "$image")
log "$image: $reported, uid 65532, read-only root filesystem, $((size / 1000000)) MB"
printf '%s\n' "$image"
