#!/usr/bin/env bash
# Builds the Kubernetes tool binaries the local control plane needs, from Go modules, once per version.
#
# Contract:
#   hack/build-tools.sh            build whatever is missing from the cache, then print the bin directory
#   hack/build-tools.sh --print    print the bin directory without building (exit 1 if anything is missing)
#   --node (with either)           also kubelet and kube-proxy, which only `make e2e`'s real node needs: the
#                                  control plane and the test suite never wait for them
# Binaries land in  ${MCAD_DEV_CACHE:-~/.cache/mcad-dev}/<tool>-<version>/bin  (one directory per pinned
# version in hack/versions.env) and are linked together into  .../bin-<key>/ , the directory printed on stdout.
# A build is written to a temporary directory and renamed into place, so an interrupted build never leaves a
# half-filled cache entry. Progress goes to stderr every few seconds, because a cold build takes many minutes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${MCAD_DEV_CACHE:-$HOME/.cache/mcad-dev}"
print_only=false
with_node=false
for arg in "$@"; do
  case $arg in
    --print) print_only=true ;;
    --node) with_node=true ;;
    *) printf '[build-tools] error: unknown argument %s (expected --print, --node)\n' "$arg" >&2; exit 2 ;;
  esac
done

log() { printf '[build-tools] %s\n' "$*" >&2; }
die() { printf '[build-tools] error: %s\n' "$*" >&2; exit 1; }

# tool group -> version, go packages, and output names (same order as packages)
declare -A version=([kubernetes]=$KUBERNETES_VERSION [node]=$KUBERNETES_VERSION [etcd]=$ETCD_VERSION [kwok]=$KWOK_VERSION [helm]=$HELM_VERSION
  [kuberay]=$KUBERAY_VERSION)
declare -A packages=(
  [kubernetes]="k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl"
  [node]="k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy"
  [etcd]="go.etcd.io/etcd/server/v3"
  [kwok]="sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl"
  [helm]="helm.sh/helm/v3/cmd/helm"
  [kuberay]="github.com/ray-project/kuberay/ray-operator"
)
declare -A outputs=(
  [kubernetes]="kube-apiserver kube-controller-manager kube-scheduler kubectl"
  [node]="kubelet kube-proxy"
  [etcd]="etcd"
  [kwok]="kwok kwokctl"
  [helm]="helm"
  [kuberay]="kuberay-operator"
)
# Each wrapper module pins the same version as versions.env; a mismatch would cache a binary under a wrong key.
declare -A module_of=([kubernetes]=k8s.io/kubernetes [node]=k8s.io/kubernetes [etcd]=go.etcd.io/etcd/server/v3 [kwok]=sigs.k8s.io/kwok [helm]=helm.sh/helm/v3
  [kuberay]=github.com/ray-project/kuberay/ray-operator)
# The node group is built from the same wrapper module as the control plane (same versions, same go.sum).
declare -A module_dir=([node]=kubernetes)
groups=(kubernetes etcd kwok helm kuberay)

key=""
for g in "${groups[@]}"; do key+="${key:+_}$g-${version[$g]}"; done
# Its version is KUBERNETES_VERSION, already in the key: the node binaries join the same directory.
$with_node && groups+=(node)
bindir="$cache/bin-$(printf '%s' "$key" | sha256sum | cut -c1-12)"

complete() {  # complete GROUP: are all of its binaries cached?
  local g=$1 o
  for o in ${outputs[$g]}; do [[ -x "$cache/$g-${version[$g]}/bin/$o" ]] || return 1; done
}

ldflags_for() {  # version stamping, as upstream's hack/lib/version.sh does; helm and kwok report their tag too
  # (kuberay needs none: its version is the constant utils.KUBERAY_VERSION in the module source)
  local g=$1 v=${version[$1]}
  case $g in
    kubernetes|node)
      local minor; minor=$(cut -d. -f2 <<<"$v")
      local f="-s -w" p
      for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        f+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
        f+=" -X $p.gitCommit=unknown -X $p.buildDate=1970-01-01T00:00:00Z"
      done
      printf '%s' "$f" ;;
    helm) printf '%s' "-s -w -X helm.sh/helm/v3/internal/version.version=$v" ;;
    kwok) printf '%s' "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${v#v}" ;;
    *) printf '%s' "-s -w" ;;
  esac
}

build_group() {
  local g=$1 v=${version[$1]} mod="$here/tools/${module_dir[$1]:-$1}"
  local pinned
  # Read go.mod directly: `go list -m` would first download the whole module graph, silently, when cold.
  pinned=$(awk -v m="${module_of[$g]}" '$1 == m && $2 ~ /^v/ {print $2; exit}' "$mod/go.mod")
  [[ "$pinned" == "$v" ]] || die "hack/tools/${module_dir[$g]:-$g}/go.mod pins ${module_of[$g]} $pinned but hack/versions.env says $v; update one of them"
  local dest="$cache/$g-$v" tmp="$cache/.tmp-$g-$v-$$"
  rm -rf "$tmp"; mkdir -p "$tmp/bin"
  log "building $g $v (${outputs[$g]}) from hack/tools/${module_dir[$g]:-$g} (downloads modules first when the Go cache is cold)"
  local start=$SECONDS pkgs=(${packages[$g]}) outs=(${outputs[$g]}) i
  for i in "${!pkgs[@]}"; do
    local n=0 last=$SECONDS line
    # -v prints each package as it is compiled: count them so the user sees the build is alive
    (cd "$mod" && CGO_ENABLED=0 go build -v -trimpath -tags=selinux,notest,grpcnotrace \
        -ldflags="$(ldflags_for "$g")" -o "$tmp/bin/${outs[$i]}" "${pkgs[$i]}" 2>&1) |
      while true; do
        # read -t: report progress even while the linker runs silently for a minute
        if IFS= read -r -t 15 line; then
          n=$((n + 1))
          if [[ "$line" == *": "* || "$line" == "#"* ]]; then printf '%s\n' "$line" >&2; fi
        elif (( $? <= 128 )); then
          break
        fi
        if (( SECONDS - last >= 15 )); then
          log "  $g/${outs[$i]}: $n packages compiled, $((SECONDS - start)) s elapsed"; last=$SECONDS
        fi
      done
    [[ -x "$tmp/bin/${outs[$i]}" ]] || { rm -rf "$tmp"; die "go build of ${pkgs[$i]} failed (see output above)"; }
    log "  built ${outs[$i]} ($(du -m "$tmp/bin/${outs[$i]}" | cut -f1) MB)"
  done
  rm -rf "$dest"; mv "$tmp" "$dest"
  log "built $g $v in $((SECONDS - start)) s"
}

missing=()
for g in "${groups[@]}"; do complete "$g" || missing+=("$g"); done

if ((${#missing[@]})); then
  $print_only && { log "not built yet: ${missing[*]} (run hack/build-tools.sh)"; exit 1; }
  command -v go >/dev/null || die "Go is required to build ${missing[*]} but 'go' is not on PATH. Install Go >= 1.26 (Debian: golang-go is too old; use the official toolchain) and re-run."
  gov=$(go env GOVERSION | sed 's/^go//')
  [[ "$(printf '%s\n1.26\n' "$gov" | sort -V | head -1)" == "1.26" ]] || die "Go >= 1.26 is required (found go$gov): helm $HELM_VERSION and etcd need it"
  # no VCS stamping: the wrapper modules live in this repo, and a dirty tree must not change a build
  export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -buildvcs=false"
  mkdir -p "$cache"
  for g in "${missing[@]}"; do build_group "$g"; done
fi

# One directory with every binary, so callers need a single path.
mkdir -p "$bindir"
for g in "${groups[@]}"; do
  for o in ${outputs[$g]}; do
    ln -sfn "$cache/$g-${version[$g]}/bin/$o" "$bindir/$o"
  done
done
printf '%s\n' "$bindir"
