#!/usr/bin/env bash
# `make demo-hub`: multi-cluster dispatch on this machine. Three real control planes with fake nodes: a hub, where
# AppWrappers are queued, and two workers, east (one 4-cpu node) and west (two 8-cpu nodes), where their objects
# are created. Walks through: pinning by label, an AppWrapper that fits only in west, and a gang smaller than the
# workers' sum that no single worker can hold (it waits). Leaves everything running; `make demo-hub-down` stops it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
kubectl=.dev/bin/kubectl
hub=.dev/kubeconfig-demo-hub
pidfile=.dev/demo-hub-controller.pid
ctl_log=.dev/demo-hub-controller.log
config=.dev/demo-hub-clusters.yaml

source hack/demo-webhooks.sh

say() { printf '\n\033[1m### %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }
cluster() { .venv/bin/python hack/localcluster.py --name "$@"; }

say "Three local control planes: the hub, and the workers east and west"
cluster demo-hub up --nodes 1 --node-cpu 1 >/dev/null
cluster demo-east up --nodes 1 --node-cpu 4 --node-memory 16Gi >/dev/null
cluster demo-west up --nodes 2 --node-cpu 8 --node-memory 16Gi >/dev/null
for worker in east west; do
  echo "# $worker"
  $kubectl --kubeconfig .dev/kubeconfig-demo-$worker get nodes \
    -o custom-columns=NAME:.metadata.name,CPU:.status.allocatable.cpu,MEMORY:.status.allocatable.memory
done

say "The clusters file: which workers, their credentials (here kubeconfig files) and labels"
# Paths are relative to the file. A production hub names Secrets instead (docs/multi-cluster.md).
cat >"$config" <<'YAML'
workers:
  - name: east
    kubeconfig: kubeconfig-demo-east
    labels: {region: east}
  - name: west
    kubeconfig: kubeconfig-demo-west
    labels: {region: west}
policy: best
YAML
cat "$config"

say "Install the AppWrapper CRD in the hub, register the admission webhooks there, start mcad-controller (hub mode)"
$kubectl --kubeconfig $hub apply --server-side -f config/crd/ >/dev/null
$kubectl --kubeconfig $hub wait --for condition=established crd/appwrappers.workload.codeflare.dev --timeout=60s \
  >/dev/null
register_webhooks $hub "$ctl_log"
if [[ -f $pidfile ]] && kill -0 "$(cat $pidfile)" 2>/dev/null; then
  echo "mcad-controller already running (pid $(cat $pidfile))"
else
  .venv/bin/mcad-controller --kubeconfig $hub --clusters-config "$config" --cluster-probe-period 1 \
    --log-format console --http-bind-address 127.0.0.1:0 "${webhook_args[@]}" >"$ctl_log" 2>&1 &
  echo $! >"$pidfile"
  for _ in $(seq 100); do grep -q "dispatcher started" "$ctl_log" && break; sleep 0.2; done
  grep -q "dispatcher started" "$ctl_log" || { echo "mcad-controller did not start; see $ctl_log" >&2; exit 1; }
  echo "mcad-controller running (pid $(cat $pidfile), log $ctl_log)"
fi
announce_webhooks $kubectl $hub "$ctl_log"
http_port=$(grep -m1 -o 'http server listening.*port=[0-9]*' "$ctl_log" | grep -o '[0-9]*$')
# /metrics and /debug answer only a bearer token whose user may read them: a ServiceAccount's of the hub.
export MCAD_TOKEN
MCAD_TOKEN=$(hack/demo-token.sh $hub)
mcadctl() { .venv/bin/mcadctl --url "http://127.0.0.1:$http_port" "$@"; }
all_usable='import json, sys; sys.exit(not all(c["usable"] for c in json.load(sys.stdin)["clusters"]))'
for _ in $(seq 150); do
  mcadctl clusters -o json 2>/dev/null | .venv/bin/python -c "$all_usable" && break
  sleep 0.2
done
run .venv/bin/mcadctl --url "http://127.0.0.1:$http_port" clusters
$kubectl --kubeconfig $hub delete appwrappers --all --wait=true >/dev/null 2>&1 || true

wait_state() {  # AppWrapper name, state
  $kubectl --kubeconfig $hub wait --for=jsonpath='{.status.state}'="$2" "appwrapper/$1" --timeout=60s >/dev/null
}

say "1. 1 cpu, pinned by label to region=west (best fit alone would pick east, the tighter fit)"
run $kubectl --kubeconfig $hub create -f config/samples/hub/aw-pinned-west.yaml
wait_state pinned-west Running

say "2. 2 pods of 6 cpu: east's 4-cpu node cannot hold one, so the gang goes to west"
run $kubectl --kubeconfig $hub create -f config/samples/hub/aw-fits-only-west.yaml
wait_state fits-only-west Running
# The pod counts in the hub's status come from west's pods.
$kubectl --kubeconfig $hub wait --for=jsonpath='{.status.running}'=2 appwrapper/fits-only-west --timeout=60s >/dev/null
$kubectl --kubeconfig $hub wait --for=jsonpath='{.status.running}'=1 appwrapper/pinned-west --timeout=60s >/dev/null
run $kubectl --kubeconfig $hub get appwrappers -o wide
echo "# in west (nothing of them exists in the hub or in east):"
run $kubectl --kubeconfig .dev/kubeconfig-demo-west get deployments,pods -o wide

say "3. 3 pods of 5 cpu: 15 of the workers' 20 cpu, but no single worker can hold all three: it waits, whole"
run $kubectl --kubeconfig $hub create -f config/samples/hub/aw-gang-too-big.yaml
wait_state gang-too-big Pending
for _ in $(seq 100); do
  [[ -n $($kubectl --kubeconfig $hub get appwrapper gang-too-big -o jsonpath='{.status.message}') ]] && break
  sleep 0.2
done
run $kubectl --kubeconfig $hub get appwrapper gang-too-big -o jsonpath='{.status.message}{"\n"}'
run .venv/bin/mcadctl --url "http://127.0.0.1:$http_port" clusters

say "Done. The three clusters and mcad-controller keep running:"
echo "  kubectl --kubeconfig $hub get appwrappers -o wide       # PATH=.dev/bin:\$PATH for kubectl"
echo "  kubectl --kubeconfig .dev/kubeconfig-demo-west get pods"
echo "  controller log: $ctl_log       stop everything: make demo-hub-down"
echo "  MCAD_TOKEN=\$(hack/demo-token.sh $hub) .venv/bin/mcadctl --url http://127.0.0.1:$http_port clusters"
