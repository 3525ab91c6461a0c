# shellcheck shell=bash
# Sourced by hack/demo.sh: puts the demo's controller, a process on this machine, behind the chart's Services
# mcad-system/mcad-controller and mcad-controller-leader, so that `mcadctl queue`, `explain` and `dashboard` reach it
# through the API server exactly as they reach an installation's leader (mcad/cli/reach.py), with no --url.
#
# The API server proxies a Service only to an Endpoints address that is the IP of the Pod it names, and never to a
# loopback address (Endpoints validation refuses one). So the controller listens on an address of this machine that
# is not loopback (controller_host_ip), and register_controller_endpoint KUBECTL IP PORT stands a Pod in for it:
# mcad-system/mcad-demo-controller, with status.podIP = IP, a container port named http = PORT and no resource
# requests, bound to one of the cluster's kwok nodes (an Endpoints address needs a node name, and kwok keeps that
# node Ready, so the node lifecycle controller never marks the Pod NotReady). It gets its IP before it is bound
# (kwok gives an IP only to a pod without one, and so leaves this one alone), and the chart's selector labels, plus
# the leader label (the demo runs one controller, which leads), only once bound: the endpoints controller then fills
# in both Services' Endpoints. No node is added, so the demo's messages still speak of its one node.
#
# Who can redirect mcadctl this way: whoever may create or label Pods, or write Endpoints, in mcad-system, the same
# people who can already do so for an installation; the demo does it with the admin kubeconfig, a tenant cannot.
# unregister_controller_endpoint KUBECTL removes the Pod (`make demo-down` removes the whole cluster anyway).

demo_endpoint_pod=mcad-demo-controller

# An IPv4 address of this machine that is not loopback or link-local (hack/hostip.py); nothing when there is none.
controller_host_ip() {
  .venv/bin/python hack/hostip.py
}

unregister_controller_endpoint() {
  local kubectl=$1
  "$kubectl" -n mcad-system delete pod "$demo_endpoint_pod" --ignore-not-found --grace-period=0 --force \
    --wait=true >/dev/null 2>&1 || true
}

register_controller_endpoint() {
  local kubectl=$1 ip=$2 port=$3 node _ endpoints=""
  # A Pod's ports cannot change: a restarted controller (another port) gets a new stand-in.
  unregister_controller_endpoint "$kubectl"
  node=$("$kubectl" get nodes -o jsonpath='{range .items[?(@.metadata.annotations.kwok\.x-k8s\.io/node=="fake")]}{.metadata.name}{"\n"}{end}' | head -1)
  [[ -n $node ]] || { echo "no kwok node to bind the controller's stand-in Pod to" >&2; return 1; }
  "$kubectl" create -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $demo_endpoint_pod
  namespace: mcad-system
  labels: {mcad.codeflare.dev/demo: controller}
spec:
  schedulerName: mcad-demo-none  # never scheduled: bound below, by hand, once it has its IP
  containers:
    - name: controller
      image: mcad-controller-runs-on-this-machine
      ports: [{name: http, containerPort: $port, protocol: TCP}]
YAML
  "$kubectl" -n mcad-system patch pod "$demo_endpoint_pod" --subresource=status --type=merge -p "{\"status\": {
      \"phase\": \"Running\", \"podIP\": \"$ip\", \"podIPs\": [{\"ip\": \"$ip\"}],
      \"conditions\": [{\"type\": \"Ready\", \"status\": \"True\"}, {\"type\": \"ContainersReady\", \"status\": \"True\"}]}}" >/dev/null
  "$kubectl" create --raw "/api/v1/namespaces/mcad-system/pods/$demo_endpoint_pod/binding" -f - >/dev/null <<JSON
{"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "$demo_endpoint_pod"},
 "target": {"apiVersion": "v1", "kind": "Node", "name": "$node"}}
JSON
  "$kubectl" -n mcad-system label pod "$demo_endpoint_pod" app.kubernetes.io/name=mcad app.kubernetes.io/instance=mcad \
    app.kubernetes.io/component=controller mcad.codeflare.dev/leader=true >/dev/null
  for _ in $(seq 150); do
    endpoints=$("$kubectl" -n mcad-system get endpoints mcad-controller-leader \
      -o jsonpath='{.subsets[*].addresses[*].ip}' 2>/dev/null || true)
    [[ $endpoints == "$ip" ]] && return 0
    sleep 0.2
  done
  echo "the Service mcad-system/mcad-controller-leader did not come to point at $ip (it has: ${endpoints:-nothing})" >&2
  return 1
}
