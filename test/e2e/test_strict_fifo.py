"""--strict-fifo: an AppWrapper that does not fit blocks every one behind it, and says so."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes.client as k8s
import pytest

from test.e2e.conftest import LOGS, AppWrappers, Controller, appwrapper, deployment_item, free_cpu_millis


@pytest.fixture(scope="module")
def controller(controller_kubeconfig: str, crd: None) -> Iterator[Controller]:
    log = LOGS / "test_strict_fifo.log"
    log.unlink(missing_ok=True)
    ctl = Controller(controller_kubeconfig, log, "--strict-fifo")
    ctl.start()
    yield ctl
    ctl.stop()


def test_a_blocked_appwrapper_holds_back_smaller_later_ones(controller: Controller, aws: AppWrappers,
                                                            core: k8s.CoreV1Api) -> None:
    free = free_cpu_millis(core)
    aws.create(appwrapper("blocker", deployment_item("blocker", 1, f"{free * 60 // 100}m")))
    aws.wait_state("blocker", "Running")
    aws.create(appwrapper("big", deployment_item("big", 1, f"{free * 60 // 100}m")))
    aws.wait_state("big", "Pending")
    aws.create(appwrapper("small", deployment_item("small", 1, f"{free * 20 // 100}m")))
    small = aws.wait_state("small", "Pending")
    assert small["message"].startswith("waiting behind earlier AppWrappers (strict FIFO)")
    assert not aws.exists("apps/v1", "Deployment", "small")

    aws.delete("blocker")
    aws.wait_state("big", "Running")
    aws.wait_state("small", "Running")
