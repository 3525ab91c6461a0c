#!/usr/bin/env bash
# Checks, before a make target starts, that this machine has what the target needs, and says in one line what to
# install when it does not (`make test` without chromium would run 20 minutes and end in errors).
#
# Contract:
#   hack/prereqs.sh TARGET     TARGET is a make target (install, unit, lint, tools, cluster, demo, demo-hub, test,
#                              screenshots, bench, image, e2e); prints nothing and exits 0 when all it needs is here, else prints
#                              one line starting with "error:" on stderr, naming every missing tool and the package
#                              that brings it (Debian names), and exits 1. An unknown TARGET is a usage error (2).
# What is checked (the same things the scripts and tests look for, where they look):
#   python   $PYTHON (default python3) >= 3.11 with venv and ensurepip (Debian: python3-venv): every target that
#            makes .venv. Checked with the system Python because that is what creates the venv.
#   go       Go >= 1.26, only when the pinned Kubernetes binaries are not built yet (hack/build-tools.sh --print):
#            tools, cluster, demo, demo-hub, test, screenshots, bench.
#   openssl  the local control plane's certificates (hack/localcluster.py): cluster, demos, test, screenshots, bench.
#   chromium and chromedriver at $MCAD_CHROMIUM and $MCAD_CHROMEDRIVER (default /usr/bin/chromium and
#            /usr/bin/chromedriver, as test/browser.py): the dashboard's browser tests in test, screenshots.
#   docker   the docker command and an engine that answers: image, e2e.
#   node     root, containerd, ctr, runc, iptables, ip and the CNI plugins bridge, host-local and loopback in
#            /usr/lib/cni (hack/e2ecluster.py's real node): e2e.
# Only bash builtins are used besides the tools checked, so a PATH that lacks one of them is judged correctly.
# shellcheck disable=SC2329  # the check_* functions are called by name ("check_$check")
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
target=${1:-}
python=${PYTHON:-python3}
chromium=${MCAD_CHROMIUM:-/usr/bin/chromium}
chromedriver=${MCAD_CHROMEDRIVER:-/usr/bin/chromedriver}

case $target in
  install | unit | lint) checks=(python) ;;
  tools) checks=(go) ;;
  cluster) checks=(go openssl) ;;
  demo | demo-hub | bench) checks=(python go openssl) ;;
  test | screenshots) checks=(python go openssl browser) ;;
  image) checks=(docker) ;;
  e2e) checks=(python go openssl docker node) ;;
  *) echo "usage: hack/prereqs.sh install|unit|lint|tools|cluster|demo|demo-hub|test|screenshots|bench|image|e2e" >&2; exit 2 ;;
esac

missing=()

# version_at_least HAVE WANT: dotted numeric versions, compared part by part.
version_at_least() {
  local -a have want
  IFS=. read -ra have <<<"$1"
  IFS=. read -ra want <<<"$2"
  local i
  for i in 0 1 2; do
    local h=${have[i]:-0} w=${want[i]:-0}
    h=${h%%[!0-9]*} w=${w%%[!0-9]*}
    ((10#${h:-0} > 10#${w:-0})) && return 0
    ((10#${h:-0} < 10#${w:-0})) && return 1
  done
  return 0
}

check_python() {
  if ! command -v "$python" >/dev/null 2>&1; then
    missing+=("Python >= 3.11 ($python not found; Debian: apt-get install python3 python3-venv)")
    return
  fi
  local version
  version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || version=""
  if [[ -z $version ]]; then
    missing+=("Python >= 3.11 ($python does not run; set PYTHON=/path/to/python3.11 or newer)")
  elif ! version_at_least "$version" 3.11; then
    missing+=("Python >= 3.11 ($python is $version; set PYTHON=/path/to/python3.11 or newer)")
  elif ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    missing+=("python3-venv ($python cannot create a virtual environment; Debian: apt-get install python3-venv)")
  fi
}

check_go() {
  # The binaries are built once and cached: with a full cache, Go is not needed at all.
  "$here/build-tools.sh" --print >/dev/null 2>&1 && return
  if ! command -v go >/dev/null 2>&1; then
    missing+=("Go >= 1.26 (builds the pinned Kubernetes binaries once; https://go.dev/dl, Debian's golang-go is too old)")
    return
  fi
  local version
  version=$(go env GOVERSION 2>/dev/null) || version=go0
  version=${version#go}
  version_at_least "$version" 1.26 ||
    missing+=("Go >= 1.26 (found go$version; https://go.dev/dl, Debian's golang-go is too old)")
}

check_openssl() {
  command -v openssl >/dev/null 2>&1 ||
    missing+=("openssl (the local cluster's certificates; Debian: apt-get install openssl)")
}

check_browser() {
  local need=()
  [[ -x $chromium ]] || need+=(chromium)
  [[ -x $chromedriver ]] || need+=(chromium-driver)
  ((${#need[@]})) || return
  missing+=("${need[*]} (the dashboard's browser tests drive $chromium through $chromedriver; Debian: apt-get install --no-install-recommends ${need[*]}; or set MCAD_CHROMIUM and MCAD_CHROMEDRIVER)")
}

check_docker() {
  if ! command -v docker >/dev/null 2>&1; then
    missing+=("docker (builds the image; Debian: apt-get install docker.io)")
  elif ! docker info >/dev/null 2>&1; then
    missing+=("a running Docker engine ('docker info' failed; as root: dockerd >/var/log/dockerd.log 2>&1 &, or systemctl start docker)")
  fi
}

check_node() {
  if ((EUID != 0)); then
    missing+=("root (a real kubelet node: containerd, cgroups, iptables; run it as root)")
  fi
  local need=() tool
  for tool in containerd ctr runc iptables ip; do command -v "$tool" >/dev/null 2>&1 || need+=("$tool"); done
  for tool in bridge host-local loopback; do [[ -x /usr/lib/cni/$tool ]] || need+=("/usr/lib/cni/$tool"); done
  ((${#need[@]})) || return
  missing+=("${need[*]} (the real node; Debian: apt-get install containerd runc iptables iproute2 containernetworking-plugins)")
}

# The hack/ scripts use associative arrays and mapfile, and empty arrays under set -u.
if [[ $target != install && $target != unit && $target != lint ]] &&
  ! ((BASH_VERSINFO[0] > 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] >= 4))); then
  missing+=("bash >= 4.4 (this is $BASH_VERSION; on macOS: brew install bash)")
fi
for check in "${checks[@]}"; do "check_$check"; done

if ((${#missing[@]})); then
  line="error: make $target needs what this machine lacks: ${missing[0]}"
  for item in "${missing[@]:1}"; do line+="; ${item}"; done
  [[ $target == test ]] && line+=". (make unit needs only Python; .ci/run installs the Debian packages)"
  printf '%s\n' "$line" >&2
  exit 1
fi
exit 0
