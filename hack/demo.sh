#!/usr/bin/env bash
# `make demo`: the seed tutorial on a local cluster like the seed's (one 8-cpu node), narrated step by step.
# Brings the cluster up if needed, installs the CRD and the chart (its webhooks, ServiceAccount and RBAC), starts
# mcad-controller in the background as the chart's ServiceAccount with the chart's flags, and walks through:
# the first AppWrapper runs, the second waits with no pods, deleting the first starts the second.
# The controller is put behind the chart's Services (hack/demo-endpoint.sh), so mcadctl finds it through the API
# server as it finds an installation's. Leaves cluster and controller running for exploration; `make demo-down`
# stops both.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export KUBECONFIG=.dev/kubeconfig
kubectl=.dev/bin/kubectl
pidfile=.dev/demo-controller.pid
ctl_log=.dev/demo-controller.log

source hack/demo-webhooks.sh
source hack/demo-identity.sh
source hack/demo-endpoint.sh
ctl_kubeconfig=.dev/demo-controller.kubeconfig

say() { printf '\n\033[1m### %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

NODES=1 NODE_CPU=8 NODE_MEMORY=8Gi hack/local-cluster.sh up >/dev/null
say "1. A local cluster like the seed's: one node with 8 cpus"
run $kubectl get nodes -o custom-columns=NAME:.metadata.name,CPU:.status.allocatable.cpu,MEMORY:.status.allocatable.memory

say "2. Install the AppWrapper CRD, register the admission webhooks (the chart) and start mcad-controller"
run $kubectl apply --server-side -f config/crd/ >/dev/null
$kubectl wait --for condition=established crd/appwrappers.workload.codeflare.dev --timeout=60s >/dev/null
register_webhooks "$KUBECONFIG" "$ctl_log"
if [[ -f $pidfile ]] && kill -0 "$(cat $pidfile)" 2>/dev/null; then
  echo "mcad-controller already running (pid $(cat $pidfile))"
else
  chart_controller_kubeconfig "$KUBECONFIG" "$ctl_kubeconfig"
  chart_controller_args
  echo "mcad-controller runs as $($kubectl --kubeconfig "$ctl_kubeconfig" auth whoami -o jsonpath='{.status.userInfo.username}')" \
    "(the chart's RBAC), with the chart's flags: ${chart_args[*]}"
  # A free port for /metrics, /debug and /ui (logged), so a busy 8080 does not stop the demo; on an address the API
  # server will proxy to (not loopback), so that mcadctl reaches it through the chart's Services.
  http_ip=$(controller_host_ip)
  .venv/bin/mcad-controller --kubeconfig "$ctl_kubeconfig" "${chart_args[@]}" --log-format console \
    --http-bind-address "${http_ip:-127.0.0.1}:0" "${webhook_args[@]}" >"$ctl_log" 2>&1 &
  echo $! >"$pidfile"
  for _ in $(seq 100); do grep -q "dispatcher started" "$ctl_log" && break; sleep 0.2; done
  grep -q "dispatcher started" "$ctl_log" || { echo "mcad-controller did not start; see $ctl_log" >&2; exit 1; }
  echo "mcad-controller running (pid $(cat $pidfile), log $ctl_log)"
fi
announce_webhooks $kubectl "$KUBECONFIG" "$ctl_log"
http_port=$(grep -m1 -o 'http server listening.*port=[0-9]*' "$ctl_log" | grep -o '[0-9]*$')
http_ip=$(grep -m1 -o 'http server listening.*address=[0-9.]*' "$ctl_log" | grep -o '[0-9.]*$')
http_url=http://$http_ip:$http_port
if [[ $http_ip == 127.* ]]; then
  # No address but loopback here: the API server will not proxy to the controller, so mcadctl needs --url.
  mcadctl=(.venv/bin/mcadctl --url "$http_url")
  echo "this machine has no address but loopback: mcadctl reaches the controller with --url $http_url"
else
  register_controller_endpoint $kubectl "$http_ip" "$http_port"
  mcadctl=(.venv/bin/mcadctl)
  echo "mcad-controller listens on $http_url, behind the chart's Services mcad-system/mcad-controller and" \
    "mcad-controller-leader (a stand-in Pod at that address): mcadctl finds it through the API server"
fi
# /metrics and /debug answer only a bearer token whose user may read them (the admin kubeconfig is a client
# certificate, which has no token to show): a ServiceAccount's, with the chart's reader rights.
token=$(hack/demo-token.sh "$KUBECONFIG")
export MCAD_TOKEN=$token
$kubectl delete appwrappers --all --wait=true >/dev/null 2>&1 || true

say "3. Create an AppWrapper: a Deployment of 2 pods taking 7 of the 8 cpus"
run $kubectl create -f config/samples/aw-01.yaml
$kubectl wait --for=jsonpath='{.status.state}'=Running appwrapper/0001-aw-generic-deployment-1 --timeout=60s >/dev/null
$kubectl wait --for=condition=Ready pod -l app=0001-aw-generic-deployment-1 --timeout=60s >/dev/null
run $kubectl get appwrappers
run $kubectl get pods

say "4. A second AppWrapper needs 1500m but only 1 cpu is free: it is queued, and nothing of it is created"
run $kubectl create -f config/samples/aw-02.yaml
$kubectl wait --for=jsonpath='{.status.state}'=Pending appwrapper/0002-aw-generic-deployment-2 --timeout=60s >/dev/null
run $kubectl get appwrappers
printf '$ kubectl describe appwrapper 0002-aw-generic-deployment-2\n'
$kubectl describe appwrapper 0002-aw-generic-deployment-2 | sed -n '/^Status:/,$p'
run $kubectl get deployments,pods
# shellcheck disable=SC2016  # shown as typed, not expanded
printf '$ export MCAD_TOKEN=$(hack/demo-token.sh $KUBECONFIG)    # who mcadctl is to the controller\n'
run "${mcadctl[@]}" explain default/0002-aw-generic-deployment-2

say "5. Delete the first AppWrapper: its capacity frees and the second is dispatched at once"
run $kubectl delete -f config/samples/aw-01.yaml
$kubectl wait --for=jsonpath='{.status.state}'=Running appwrapper/0002-aw-generic-deployment-2 --timeout=60s >/dev/null
$kubectl wait --for=condition=Ready pod -l app=0002-aw-generic-deployment-2 --timeout=60s >/dev/null
run $kubectl get appwrappers
run $kubectl get pods -l app=0002-aw-generic-deployment-2

say "Done. The cluster and mcad-controller keep running:"
echo "  export KUBECONFIG=$KUBECONFIG PATH=.venv/bin:.dev/bin:\$PATH    # then kubectl get appwrappers"
echo "  export MCAD_TOKEN=\$(hack/demo-token.sh $KUBECONFIG)    # who mcadctl and curl are to the controller"
echo "  ${mcadctl[*]#.venv/bin/} queue             # also: mcadctl explain NAMESPACE/NAME, mcadctl ledger"
if [[ $http_ip == 127.* ]]; then
  echo "  dashboard: open $http_url/ui/ and paste \$MCAD_TOKEN when it asks for a token"
else
  echo "  mcadctl dashboard --open   # the live dashboard, through the API server (Ctrl-C stops it)"
fi
echo "  curl -H \"Authorization: Bearer \$MCAD_TOKEN\" $http_url/metrics    # no token: 401"
echo "  controller log: $ctl_log       stop everything: make demo-down"
