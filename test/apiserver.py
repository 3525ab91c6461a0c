"""The API server as a test subject: what it was asked (``apiserver_request_total``) and an outage of it.

Contract:
- ``request_totals(api)`` reads the API server's /metrics with the client's credentials (the admin kubeconfig's
  are allowed; the metric is cluster-wide, not per client) and returns ``apiserver_request_total`` summed by
  ``RequestKey`` (verb, group, resource, subresource, code; other labels, dry_run included, are summed over).
  ``Totals.count(...)`` sums the keys that match the filters given; ``Totals - Totals`` gives what happened in
  between. Server-side apply is the verb ``APPLY``.
- ``local_cluster(name, *args)`` runs hack/localcluster.py for the local cluster ``name``.
- ``api_server_outage(name)`` stops that cluster's kube-apiserver at once (SIGKILL, as a crash: every connection
  drops and new ones are refused) and, on leaving the block, starts it again with the same flags, port and
  certificates; the block gets an ``Outage`` whose ``ended`` is the time (time.time()) the restarted API server
  first answered /readyz. The restart happens whatever the block raised.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import kubernetes.client as k8s

from test.support import REPO


class RequestKey(NamedTuple):
    verb: str
    group: str
    resource: str
    subresource: str
    code: str


class Totals(Counter[RequestKey]):
    def count(self, *, verb: str | None = None, group: str | None = None, resource: str | None = None,
              subresource: str | None = None, code: str | None = None) -> float:
        wanted = {"verb": verb, "group": group, "resource": resource, "subresource": subresource, "code": code}
        return sum(n for key, n in self.items()
                   if all(value is None or getattr(key, field) == value for field, value in wanted.items()))

    def __sub__(self, other: Counter[RequestKey]) -> Totals:
        return Totals({key: n - other.get(key, 0) for key, n in self.items() if n - other.get(key, 0)})


_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def request_totals(api: k8s.ApiClient) -> Totals:
    # The generated client's two steps (auth headers, then the call), keeping the raw text answer.
    method, url, headers, body, post_params = api.param_serialize(
        "GET", "/metrics", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"])
    response = api.call_api(method, url, headers, body, post_params, _request_timeout=30)
    text = response.read().decode()
    assert response.status == 200, f"GET /metrics: {response.status}: {text[:500]}"
    return parse_request_totals(text)


def parse_request_totals(text: str) -> Totals:
    """``apiserver_request_total`` of a Prometheus text exposition, summed by RequestKey."""
    totals = Totals()
    for sample in _SAMPLE.finditer(text):
        labels = dict(_LABEL.findall(sample["labels"]))
        key = RequestKey(labels.get("verb", ""), labels.get("group", ""), labels.get("resource", ""),
                         labels.get("subresource", ""), labels.get("code", ""))
        totals[key] += int(float(sample["value"]))
    return totals


def local_cluster(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """hack/localcluster.py --name ``name`` ``args``: its stdout captured, its progress on stderr."""
    return subprocess.run([sys.executable, str(REPO / "hack" / "localcluster.py"), "--name", name, *args],
                          text=True, stdout=subprocess.PIPE, timeout=300)


@dataclass
class Outage:
    started: float
    ended: float | None = None


@contextlib.contextmanager
def api_server_outage(name: str) -> Iterator[Outage]:
    stop = local_cluster(name, "stop", "--kill", "kube-apiserver")
    assert stop.returncode == 0, f"stopping the kube-apiserver of {name} failed"
    outage = Outage(time.time())
    try:
        yield outage
    finally:
        start = local_cluster(name, "start", "kube-apiserver")
        assert start.returncode == 0, f"restarting the kube-apiserver of {name} failed"
        # It prints the time of the first healthy answer.
        outage.ended = float(start.stdout.strip().splitlines()[-1])
