#!/usr/bin/env bash
# `make e2e`: the end-to-end suite (test/e2e) against a throwaway KinD cluster, on a machine with Docker.
#
#   hack/e2e-kind.sh [PYTEST ARGS...]          e.g. hack/e2e-kind.sh -k gang   or   make e2e E2E_ARGS="-k gang"
#
# Steps, each with a progress line giving the seconds elapsed:
#   0. Check the prerequisites (docker and its daemon, kind, the .venv of `make install`, kubectl and helm from
#      hack/build-tools.sh, which needs go only when they are not built yet).
#   1. kind create cluster --name $KIND_CLUSTER_NAME, with the node image kindest/node:$KUBERNETES_VERSION
#      (hack/versions.env) when that tag exists, else kind's default; wait until the node is Ready.
#   2. docker build -t mcad:e2e . and load the image into the node.
#   3. kwok inside the cluster: the release manifest of $KWOK_VERSION (CRDs, RBAC, controller Deployment), then
#      hack/kwok-stages.yaml applied as Stage objects (the same node and pod lifecycle as the local control
#      plane), then the local control plane's fake nodes (hack/kind/fake_nodes.py: the same names, shape and
#      NODES/NODE_CPU/NODE_MEMORY/NODE_GPU/NODE_PODS defaults). The real node is labelled, its system DaemonSets
#      and kwok are pinned to it (hack/kind/*-patch.yaml) and it is cordoned: only the fake nodes count as
#      capacity, which is what the suite measures, while the system pods keep running.
#   4. helm install charts/mcad with that image (hack/kind/values.yaml: pullPolicy Never, on the real node) and
#      wait for the rollout and for "dispatcher started" in a controller pod's log (the leader's, when the chart
#      runs several replicas): the image starts in a real kubelet and syncs with the chart's ServiceAccount.
#   5. test/installed against that installation, as `make e2e` runs it on hack/e2ecluster.py's real node (the
#      tutorial through the webhooks, leader failover, helm upgrade and uninstall, /metrics and /healthz through
#      the Service, mcadctl, certificate renewal), but for its checks of that node itself (markers bringup and
#      this_machine). The suite reaches Service and pod addresses from this machine: on Linux as root, routes
#      to KinD's Service (10.96.0.0/16) and pod (10.244.0.0/16) ranges through the node's container are added
#      for the run and removed on exit; elsewhere this step is left out, and the script says so.
#      Then the log is kept, the Deployment scaled to zero and its Lease deleted: no second controller after.
#   6. MCAD_TEST_KUBECONFIG=<this cluster's kubeconfig> CLUSTER_NAME=kind-<name> .venv/bin/pytest test/e2e
#      $E2E_ARGS "$@" (CLUSTER_NAME keeps hack/kuberay.py's state apart from the local control plane's).
#   7. On exit the cluster is deleted (not with KEEP_CLUSTER=1); after a failure its logs are exported first.
#
# From step 6 on, the suite does exactly what it does on the local control plane: it re-installs the chart with
# replicaCount 0 (test/chart.py), runs mcad-controller as local processes with a token of the chart's
# ServiceAccount against this cluster's API server, and its pods land on kwok's fake nodes. What only KinD adds is
# steps 2, 4 and 5: the image and the chart's Deployment in a kubelet.
#
# Environment:
#   KIND_CLUSTER_NAME  cluster name (default mcad-e2e); its kubeconfig is .dev/kind/kubeconfig-<name>
#   KIND_NODE_IMAGE    node image to use instead, e.g. one listed in the release notes of your kind version
#   KEEP_CLUSTER=1     keep the cluster afterwards
#   REUSE_CLUSTER=1    run against an existing cluster of that name (e.g. one kept earlier); it is then kept
#   E2E_ARGS           extra pytest arguments, split on whitespace (pass quoted ones as arguments instead)
#   KWOK_MANIFEST      kwok's manifest (default: the $KWOK_VERSION release asset), e.g. a local copy
#   NODES, NODE_CPU, NODE_MEMORY, NODE_GPU, NODE_PODS   the fake nodes, as for hack/localcluster.py
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$repo/hack/versions.env"

name="${KIND_CLUSTER_NAME:-mcad-e2e}"
image="mcad:e2e"
# The real (Docker) node carries this label; hack/kind/*.yaml select it. Fake nodes never have it.
real_node_label="mcad.dev/e2e-real-node"
# Release and namespace as in test/chart.py, so the suite's `helm upgrade --install` takes over this release.
release="mcad"
chart_namespace="mcad-system"
kwok_manifest="${KWOK_MANIFEST:-https://github.com/kubernetes-sigs/kwok/releases/download/$KWOK_VERSION/kwok.yaml}"
state="$repo/.dev/kind"
kubeconfig="$state/kubeconfig-$name"
cluster_logs="$state/logs-$name"
controller_log="$repo/.dev/e2e-logs/kind-in-cluster-controller.log"
python="$repo/.venv/bin/python"
pytest="$repo/.venv/bin/pytest"

log() { printf '[e2e-kind] %s\n' "$*" >&2; }
step() { printf '[e2e-kind] %5d s  %s\n' "$SECONDS" "$*" >&2; }
die() { printf '[e2e-kind] error: %s\n' "$*" >&2; exit 1; }

# poll SECONDS WHAT COMMAND...: run COMMAND every 2 s until it succeeds; fail naming WHAT at the deadline.
poll() {
  local timeout=$1 what=$2 deadline=$((SECONDS + $1))
  shift 2
  until "$@"; do
    ((SECONDS < deadline)) || die "timed out after $timeout s waiting for $what"
    sleep 2
  done
}

# ------------------------------------------------------------------------------------------- 0. prerequisites

((BASH_VERSINFO[0] > 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] >= 4))) ||
  die "bash >= 4.4 is required (found $BASH_VERSION; macOS: brew install bash)"
command -v docker >/dev/null 2>&1 ||
  die "docker is required but not on PATH: install Docker Engine (https://docs.docker.com/engine/install/) or Docker Desktop"
docker info >/dev/null 2>&1 ||
  die "docker is installed but its daemon does not answer ('docker info' failed): start Docker, or add your user to the docker group"
command -v kind >/dev/null 2>&1 ||
  die "kind is required but not on PATH: 'go install sigs.k8s.io/kind@latest', or a release binary (https://kind.sigs.k8s.io/docs/user/quick-start/#installation)"
[[ -x "$pytest" ]] || die "no $pytest: run 'make install' first (make e2e does)"

step "checking the pinned tools (hack/build-tools.sh: kubectl $KUBERNETES_VERSION, helm $HELM_VERSION)"
if ! bindir="$("$repo/hack/build-tools.sh" --print 2>/dev/null)"; then
  command -v go >/dev/null 2>&1 ||
    die "go is required to build kubectl and helm (hack/build-tools.sh) but not on PATH: install Go >= 1.26 (https://go.dev/dl/), or run 'make tools' where Go is"
  log "building them first (minutes when the Go cache is cold)"
  bindir="$("$repo/hack/build-tools.sh")"
fi
kubectl_bin="$bindir/kubectl"
helm_bin="$bindir/helm"
if [[ ! -x "$kubectl_bin" ]]; then
  kubectl_bin="$(command -v kubectl)" ||
    die "kubectl is required: 'make tools' builds the pinned one, or install it (https://kubernetes.io/docs/tasks/tools/)"
fi
[[ -x "$helm_bin" ]] || die "helm is missing from $bindir: run 'make tools'"

# Every kubectl and helm call names this cluster's kubeconfig: the user's current context is never touched.
k() { "$kubectl_bin" --kubeconfig "$kubeconfig" "$@"; }

# ------------------------------------------------------------------------------------------- cleanup on exit

created=false
routes=()
tmp="$(mktemp -d)"
# shellcheck disable=SC2329  # run by the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  rm -rf "$tmp"
  local route
  for route in "${routes[@]}"; do ip route delete "$route" 2>/dev/null || log "could not remove the route $route"; done
  if $created; then
    if ((rc != 0)); then
      k get pods -A -o wide >&2 2>/dev/null || true
      if kind export logs "$cluster_logs" --name "$name" >/dev/null 2>&1; then log "cluster logs: $cluster_logs"; fi
    fi
    if [[ "${KEEP_CLUSTER:-0}" == 1 ]]; then
      log "keeping cluster $name (KEEP_CLUSTER=1): export KUBECONFIG=$kubeconfig"
      log "run the suite again with REUSE_CLUSTER=1; delete it with: kind delete cluster --name $name"
    else
      step "deleting the cluster $name"
      kind delete cluster --name "$name" --kubeconfig "$kubeconfig" >&2 || log "could not delete cluster $name"
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------------------------------- 1. cluster

mkdir -p "$state"
if kind get clusters 2>/dev/null | grep -qx -- "$name"; then
  [[ "${REUSE_CLUSTER:-0}" == 1 ]] ||
    die "a kind cluster named $name exists already (kept by KEEP_CLUSTER=1?): delete it with 'kind delete cluster --name $name', or set REUSE_CLUSTER=1 to run against it"
  step "reusing kind cluster $name (REUSE_CLUSTER=1; it is kept afterwards)"
  kind get kubeconfig --name "$name" >"$kubeconfig"
  chmod 600 "$kubeconfig"
else
  node_image_args=()
  if [[ -n "${KIND_NODE_IMAGE:-}" ]]; then
    node_image_args=(--image "$KIND_NODE_IMAGE")
  elif docker image inspect "kindest/node:$KUBERNETES_VERSION" >/dev/null 2>&1 || {
      step "pulling kindest/node:$KUBERNETES_VERSION (about 1 GB the first time)"
      docker pull --quiet "kindest/node:$KUBERNETES_VERSION" >/dev/null 2>&1
    }; then
    node_image_args=(--image "kindest/node:$KUBERNETES_VERSION")
  else
    log "no node image kindest/node:$KUBERNETES_VERSION (kind publishes some patch releases only): using the default of"
    log "$(kind version), so Kubernetes differs from the $KUBERNETES_VERSION of 'make test'; KIND_NODE_IMAGE pins one"
  fi
  step "creating kind cluster $name (${node_image_args[1]:-the default node image of $(kind version | cut -d' ' -f1-2)})"
  created=true
  kind create cluster --name "$name" --kubeconfig "$kubeconfig" --wait 180s "${node_image_args[@]}" >&2
fi
k wait --for=condition=Ready nodes --all --timeout=180s >/dev/null
mapfile -t real_nodes < <(kind get nodes --name "$name")
((${#real_nodes[@]})) || die "kind reports no nodes for cluster $name"
step "cluster up: $(k version -o json | "$python" -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])'), node(s) ${real_nodes[*]}"

# ------------------------------------------------------------------------------------------- 2. image

step "building $image from the Dockerfile"
docker build --tag "$image" "$repo" >&2
step "loading $image into the node(s)"
if ! kind load docker-image "$image" --name "$name" >"$tmp/load.log" 2>&1; then
  # Docker's containerd image store can hand kind an image whose other-platform parts are missing ("content
  # digest ... not found", https://github.com/kubernetes-sigs/kind/issues/3795); a single-platform archive loads.
  log "kind load docker-image failed ($(tail -n 1 "$tmp/load.log")); loading a single-platform archive instead"
  platform="$(docker version --format '{{.Server.Os}}/{{.Server.Arch}}')"
  docker image save --platform "$platform" --output "$tmp/image.tar" "$image" 2>/dev/null ||
    docker image save --output "$tmp/image.tar" "$image"
  kind load image-archive "$tmp/image.tar" --name "$name" >&2
fi

# ------------------------------------------------------------------------------------------- 3. kwok and nodes

step "labelling the real node(s) $real_node_label=true and keeping kube-system's DaemonSets on them"
k label nodes "${real_nodes[@]}" "$real_node_label=true" --overwrite >/dev/null
mapfile -t daemonsets < <(k -n kube-system get daemonsets -o name)
for ds in "${daemonsets[@]}"; do
  k -n kube-system patch "$ds" --type strategic --patch-file "$repo/hack/kind/daemonset-patch.yaml" >/dev/null
done
for ds in "${daemonsets[@]}"; do
  k -n kube-system rollout status "$ds" --timeout=180s >/dev/null
done

step "installing kwok $KWOK_VERSION ($kwok_manifest)"
k apply -f "$kwok_manifest" >/dev/null
k -n kube-system patch deployment/kwok-controller --type strategic \
  --patch-file "$repo/hack/kind/kwok-controller-patch.yaml" >/dev/null
k -n kube-system rollout status deployment/kwok-controller --timeout=300s >/dev/null
k wait --for=condition=Established crd/stages.kwok.x-k8s.io --timeout=60s >/dev/null
# Strict: a misspelt field in a stage is an error here, not a lifecycle step silently missing.
k apply --validate=strict -f "$repo/hack/kwok-stages.yaml" >/dev/null

step "cordoning the real node(s), creating the fake nodes of hack/localcluster.py"
k cordon "${real_nodes[@]}" >/dev/null
"$python" "$repo/hack/kind/fake_nodes.py" >"$tmp/nodes.json"
k apply --validate=strict -f "$tmp/nodes.json" >/dev/null
fake_count="$("$python" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["items"]))' "$tmp/nodes.json")"

# shellcheck disable=SC2329  # run by poll
fake_nodes_ready() {  # all fake nodes (label type=kwok) Ready and without taints, as hack/localcluster.py waits
  k get nodes -l type=kwok -o jsonpath='{range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status} {.spec.taints[*].key}{"\n"}{end}' |
    awk -v want="$fake_count" '$2 == "True" && NF == 2 { ready++ } END { exit !(ready == want) }'
}
poll 180 "$fake_count fake node(s) Ready and untainted" fake_nodes_ready
step "$fake_count fake node(s) Ready: $(k get nodes -l type=kwok -o jsonpath='{.items[0].status.allocatable}' 2>/dev/null)"

# ------------------------------------------------------------------------------------------- 4. chart + image

step "helm install charts/mcad with $image (hack/kind/values.yaml)"
"$helm_bin" upgrade --install "$release" "$repo/charts/mcad" --namespace "$chart_namespace" --create-namespace \
  --values "$repo/hack/kind/values.yaml" --wait --timeout 300s --kubeconfig "$kubeconfig" >/dev/null
# Found by label, not by name: the chart names its Deployment, and may run more than one replica (one leader).
controller_pods="app.kubernetes.io/instance=$release,app.kubernetes.io/component=controller"
deployment="$(k -n "$chart_namespace" get deployment -l "$controller_pods" -o name)"
[[ "$deployment" == deployment.apps/* && "$deployment" != *$'\n'* ]] ||
  die "expected one controller Deployment labelled $controller_pods in $chart_namespace, found: ${deployment:-none}"
k -n "$chart_namespace" rollout status "$deployment" --timeout=300s >/dev/null
# shellcheck disable=SC2329  # run by poll
controller_started() {  # read whole, not piped into grep -q: its early exit would fail kubectl (pipefail)
  local logs
  logs="$(k -n "$chart_namespace" logs -l "$controller_pods" --tail=-1 2>/dev/null)" || return 1
  [[ "$logs" == *"dispatcher started"* ]]
}
poll 120 "the in-cluster controller to log 'dispatcher started'" controller_started

# ------------------------------------------------------------------------------------------- 5. the installed suite

installed_rc=0
if [[ "$(uname -s)" == Linux && $EUID -eq 0 ]]; then
  node_ip="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "${real_nodes[0]}" |
    awk '{print $1}')"
  [[ -n "$node_ip" ]] || die "no address of the node container ${real_nodes[0]}"
  for range in 10.96.0.0/16 10.244.0.0/16; do
    ip route replace "$range" via "$node_ip" && routes+=("$range")
  done
  step "running test/installed against the chart's Deployment (routes to $node_ip for ${routes[*]})"
  set +e
  MCAD_TEST_KUBECONFIG="$kubeconfig" "$pytest" test/installed --installed -m "not bringup and not this_machine" \
    -p no:cacheprovider
  installed_rc=$?
  set -e
  step "test/installed on KinD finished with exit code $installed_rc"
else
  log "test/installed left out: it reaches Service and pod addresses, which needs routes (Linux, as root)"
fi

mkdir -p "$(dirname "$controller_log")"
k -n "$chart_namespace" logs -l "$controller_pods" --tail=-1 --prefix >"$controller_log"
step "the image runs in the cluster (log: ${controller_log#"$repo"/}); scaling it to zero for the suite"
k -n "$chart_namespace" scale "$deployment" --replicas=0 >/dev/null
# shellcheck disable=SC2329  # run by poll
controller_gone() {
  local pods
  pods="$(k -n "$chart_namespace" get pods -l "$controller_pods" -o name)" || return 1
  [[ -z "$pods" ]]
}
poll 120 "the in-cluster controller pods to go" controller_gone
# Its leader-election Lease goes too: the suite's leader-election tests start from no Lease, as they do on the
# local control plane, where no controller ran before them.
k -n "$chart_namespace" delete leases --all >/dev/null

# ------------------------------------------------------------------------------------------- 6. the suite

extra=()
read -r -a extra <<<"${E2E_ARGS:-}"
step "running test/e2e against $name: pytest test/e2e ${extra[*]} $*"
set +e
# CLUSTER_NAME: hack/kuberay.py (the RayCluster test's operator) keeps its state under .dev/clusters/<name>/;
# without it, it would use the default local cluster's, and could stop an operator serving that cluster.
# MCAD_E2E_WEBHOOK_HOST: the suite registers its webhooks by URL to the controllers it runs on this machine; the
# API server runs in the node's container, where 127.0.0.1 is not this machine: the kind network's gateway is.
webhook_host=$(docker network inspect kind -f '{{range .IPAM.Config}}{{if .Gateway}}{{.Gateway}} {{end}}{{end}}' |
  tr ' ' '\n' | grep -m1 -E '^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$') || die "no IPv4 gateway on docker network kind"
CLUSTER_NAME="kind-$name" MCAD_TEST_KUBECONFIG="$kubeconfig" MCAD_E2E_WEBHOOK_HOST="$webhook_host" \
  "$pytest" test/e2e "${extra[@]}" "$@"
rc=$?
set -e
step "test/e2e on KinD finished with exit code $rc"
((rc == 0)) && rc=$installed_rc
exit "$rc"
