"""``test.perf.phases`` puts each py-spy sample of the controller in the phase its stack shows."""

from __future__ import annotations

from pathlib import Path

from test.perf.phases import phase_of, summarize

LOOP = ("Thread._bootstrap (threading.py:1002);Thread.run (threading.py:982);Dispatcher.run "
        "(mcad/loop/dispatcher.py:121);Dispatcher.process_next (mcad/loop/dispatcher.py:150)")


def test_each_stack_goes_to_the_first_phase_that_matches() -> None:
    judging = f"{LOOP};DispatchCycle.run (mcad/loop/cycle.py:110);DispatchCycle._pass (mcad/loop/cycle.py:130);" \
              "walk (mcad/model/walk.py:147);fits (mcad/model/fit.py:100)"
    # A dispatch made inside the walk is the dispatch's, not the judgement's.
    dispatching = f"{judging};DispatchCycle.dispatch (mcad/loop/cycle.py:169)"
    telling = f"{LOOP};DispatchCycle.run (mcad/loop/cycle.py:110);DispatchCycle._tell (mcad/loop/cycle.py:150)"
    informer = "Thread.run (threading.py:982);Informer.run (mcad/k8s/informer.py:300);" \
               "<lambda> (mcad/loop/dispatcher.py:99)"
    status = "Writes._work (mcad/k8s/writes.py:271);job (mcad/loop/statussync.py:312)"
    assert [phase_of(s) for s in (judging, dispatching, telling, informer, status, "main (x.py:1)")] == [
        "judging", "dispatching", "telling", "informers", "writes: status", "other"]


def test_the_summary_gives_each_phase_its_share_of_the_samples(tmp_path: Path) -> None:
    raw = tmp_path / "p.txt"
    raw.write_text(f"{LOOP};Dispatcher._sync_pod (mcad/loop/dispatcher.py:300) 3\n"
                   "Writes._work (mcad/k8s/writes.py:271);create_objects (mcad/k8s/dispatchjob.py:50) 1\n"
                   "garbage line\n")
    assert summarize(raw) == {"samples": 4, "share_pct": {"pod events": 75.0, "writes: objects": 25.0}}
    assert summarize(tmp_path / "missing.txt") == {}
