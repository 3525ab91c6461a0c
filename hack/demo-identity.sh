# Sourced by hack/demo.sh, after register_webhooks (hack/demo-webhooks.sh) installed the chart: the demo's
# controller runs as an installation runs it, not as cluster-admin.
#
# chart_controller_kubeconfig ADMIN_KUBECONFIG OUT writes a kubeconfig that carries only a TokenRequest token (24 h)
# of the chart's ServiceAccount mcad-system/mcad, with the admin kubeconfig's server and CA: the controller then has
# exactly the chart's RBAC (what it is not granted, the API server refuses, and the AppWrapper says so).
#
# chart_controller_args sets chart_args to the policy flags of the chart's Deployment, rendered by helm with the
# values register_webhooks installed: the kind allowlist (--admission-allowed-kinds), fit and placement, bounds,
# the priority ceiling, the names of the webhook objects. Not where it listens, logs or elects a leader: the demo
# runs one process on this machine.

chart_controller_kubeconfig() {
  local admin=$1 out=$2 token
  token=$(.dev/bin/kubectl --kubeconfig "$admin" -n mcad-system create token mcad --duration 24h)
  (
    umask 077  # a credential: readable by its owner only
    .dev/bin/kubectl --kubeconfig "$admin" config view --raw --minify --flatten |
      TOKEN=$token .venv/bin/python -c '
import os, sys, yaml
config = yaml.safe_load(sys.stdin)
config["users"] = [{"name": "mcad-chart-serviceaccount", "user": {"token": os.environ["TOKEN"]}}]
config["contexts"][0]["context"]["user"] = "mcad-chart-serviceaccount"
yaml.safe_dump(config, sys.stdout)' >"$out"
  )
}

chart_controller_args() {
  local helm
  helm=$(hack/build-tools.sh --print)/helm
  mapfile -t chart_args < <("$helm" template mcad charts/mcad --namespace mcad-system --set replicaCount=0 \
      --set webhook.url="https://127.0.0.1:$webhook_port" --show-only templates/deployment.yaml |
    .venv/bin/python -c '
import sys, yaml
deployment = yaml.safe_load(sys.stdin)
# Where it listens, how it logs and leader election are the demo'"'"'s own (one local process).
local = ("--http-bind-address", "--webhook-bind-address", "--log-format", "--log-level", "--leader-elect")
for arg in deployment["spec"]["template"]["spec"]["containers"][0]["args"]:
    if not arg.startswith(local):
        print(arg)')
  [[ " ${chart_args[*]} " == *" --admission-allowed-kinds="* ]] || {
    echo "the chart's Deployment passes no --admission-allowed-kinds" >&2
    exit 1
  }
}
