"""hack/hoststate.py's reading of the host: which iptables rules and chains, mounts and paths belong to a node.

The whole restore runs in `make e2e` against a real kubelet; these check the parts that decide what is touched, so a
mistake that would delete someone else's rule or directory fails here first.
"""

from __future__ import annotations

from test.support import load_hack_module

hoststate = load_hack_module("hoststate")
SCOPE = hoststate.Scope(paths=("/var/lib/mcad-e2e", "/run/mcad-e2e"), cgroup="mcad-e2e", bridge="mcad-e2e0",
                        pod_cidr="10.250.0.0/24")
RULES = [
    "-P OUTPUT ACCEPT",
    "-N DOCKER",
    "-N KUBE-SERVICES",
    "-N KUBE-SVC-NPX46M4PTMTKRN6Y",
    "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
    "-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER",
    "-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"default/kubernetes:https cluster IP\" "
    "-m tcp --dport 443 -j KUBE-SVC-NPX46M4PTMTKRN6Y",
    "-A FORWARD -i mcad-e2e0 -j ACCEPT",
    "-A POSTROUTING -s 10.250.0.0/24 -j MASQUERADE",
    "-A POSTROUTING -s 10.250.0.0/16 -j MASQUERADE",
]


def test_chains_are_read_from_new_chain_and_policy_lines() -> None:
    assert hoststate.chains_of(RULES) == {"OUTPUT", "DOCKER", "KUBE-SERVICES", "KUBE-SVC-NPX46M4PTMTKRN6Y"}


def test_only_rules_jumping_to_the_new_chains_or_naming_the_node_network_are_its_own() -> None:
    new = {"KUBE-SERVICES", "KUBE-SVC-NPX46M4PTMTKRN6Y"}
    owned = [r for r in RULES
             if r.startswith("-A ") and (hoststate.jumps_to(r, new) or hoststate.names_network(r, SCOPE))]
    assert owned == [RULES[4], RULES[6], RULES[7], RULES[8]]
    # Docker's rule and a wider network that merely contains the pod network's prefix are not.
    assert not hoststate.names_network(RULES[9], SCOPE)
    assert not hoststate.jumps_to(RULES[5], new)


def test_a_rule_is_split_into_arguments_with_its_quoted_comment_whole() -> None:
    assert hoststate._split_rule(RULES[4][3:]) == ["OUTPUT", "-m", "comment", "--comment",
                                                    "kubernetes service portals", "-j", "KUBE-SERVICES"]


def test_paths_under_a_scope_are_its_own_and_look_alike_neighbours_are_not() -> None:
    assert hoststate.under("/var/lib/mcad-e2e", SCOPE.paths)
    assert hoststate.under("/var/lib/mcad-e2e/kubelet/pods/x/volumes", SCOPE.paths)
    assert not hoststate.under("/var/lib/mcad-e2e-fault/kubelet", SCOPE.paths)
    assert not hoststate.under("/var/lib", SCOPE.paths)


def test_a_process_is_the_nodes_when_its_command_line_names_one_of_its_paths_whole() -> None:
    assert hoststate.names_scope("containerd --config /var/lib/mcad-e2e/config/containerd.toml", SCOPE)
    assert hoststate.names_scope("containerd-shim-runc-v2 -namespace k8s.io -address /run/mcad-e2e/containerd.sock",
                                 SCOPE)
    assert hoststate.names_scope("kubelet --root-dir=/var/lib/mcad-e2e", SCOPE)
    assert not hoststate.names_scope("containerd --config /var/lib/mcad-e2e-fault/config/containerd.toml", SCOPE)
    assert not hoststate.names_scope("dockerd", SCOPE)
