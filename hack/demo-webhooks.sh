# Sourced by the demos: registers mcad's admission webhooks against a local API server as an installation would,
# for a controller running on this machine. `register_webhooks KUBECONFIG LOG` installs the chart (release mcad in
# mcad-system, no replicas: the controller runs here) with webhook.url=https://127.0.0.1:PORT and sets
# webhook_args to the flags that controller needs. PORT is the one the running controller's LOG names, else a
# free one. The controller then issues its CA and certificate into the chart's Secret and patches the CA into the
# two webhook configurations; from then on every AppWrapper create or update goes through it, and while it is
# stopped they are refused (failurePolicy Fail).
register_webhooks() {
  local kubeconfig=$1 log=$2 port="" helm
  helm=$(hack/build-tools.sh --print)/helm
  if [[ -f $log ]]; then port=$(grep -o 'webhook server listening.*port=[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true); fi
  if [[ -z $port ]]; then
    port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  fi
  "$helm" upgrade --install mcad charts/mcad --kubeconfig "$kubeconfig" --namespace mcad-system --create-namespace \
    --set replicaCount=0 --set webhook.url="https://127.0.0.1:$port" --wait --timeout 120s >/dev/null
  webhook_port=$port
  webhook_args=(--webhook-bind-address "127.0.0.1:$port" --webhook-cert-hosts 127.0.0.1)
}

# After the controller started: wait for its certificate, then say where admission goes.
announce_webhooks() {
  local kubectl=$1 kubeconfig=$2 log=$3
  for _ in $(seq 100); do grep -q "webhook CA bundle patched\|webhook certificate loaded" "$log" && break; sleep 0.2; done
  grep -q "webhook certificate loaded" "$log" || { echo "the webhook certificate was not loaded; see $log" >&2; exit 1; }
  echo "admission webhooks registered with the API server: https://127.0.0.1:$webhook_port/{mutate,validate}"
  echo "  (failurePolicy Fail: while mcad-controller is stopped, AppWrapper creates and updates are refused)"
  "$kubectl" --kubeconfig "$kubeconfig" get validatingwebhookconfigurations,mutatingwebhookconfigurations mcad
}
