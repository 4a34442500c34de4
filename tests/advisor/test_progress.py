"""Progress of `advise`: per phase, simulations done of the total and an ETA, on a fake clock;
events from worker threads reach the callback only on the calling thread; the plain line on a
stream that is not a terminal; the command line's stderr when it is piped."""

from __future__ import annotations

import io
import threading

from typer.testing import CliRunner

from advisor.advise.progress import (
    PHASE_WEIGHTS,
    Counted,
    PlainLines,
    ProgressEvent,
    Tracker,
    duration_text,
)
from costline.cli import app


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FakeEvaluator:
    """`Evaluator.map`'s contract: outcomes in order, on_submit(k) with the simulations it adds,
    on_done(1) per finished simulation, each simulation taking `step_s` on the fake clock."""

    parallel, count = False, 0

    def __init__(self, clock: FakeClock, step_s: float) -> None:
        self.clock, self.step_s = clock, step_s

    def map(self, tasks, on_done=None, on_submit=None):
        if on_submit:
            on_submit(len(tasks))
        out = []
        for t in tasks:
            self.clock.t += self.step_s
            out.append(t * 2)
            if on_done:
                on_done(1)
        return out


def test_counts_rise_to_the_total_and_the_eta_is_the_pace_so_far() -> None:
    clock, events = FakeClock(), []
    tracker = Tracker(events.append, clock)
    ev = FakeEvaluator(clock, 2.0)
    with tracker.phase("search", 10) as ph:
        assert Counted(ev, ph).map([1, 2, 3]) == [2, 4, 6]
        ph.expect(6)  # fewer than first thought: the total drops to what will run
        Counted(ev, ph).map([4, 5, 6])
    search = [e for e in events if e.phase == "search"]
    assert [e.done for e in search] == sorted(e.done for e in search)  # monotonic
    assert search[-1].finished and search[-1].done == search[-1].total == 6
    # after 2 of 10 expected at 2 s each: 4 s elapsed, 8 to go at 2 s -> ETA 16 s
    two = next(e for e in search if e.done == 2 and not e.finished)
    assert (two.total, two.elapsed_s, two.eta_s) == (10, 4.0, 16.0)
    assert two.text() == "search: 2/10 simulations, ETA 16 s"
    assert search[0].eta_s is None and search[0].text() == "search: 0/10 simulations, ETA ..."
    assert search[-1].text() == "search: 6/6 simulations, done in 12 s"
    assert search[-1].fraction == PHASE_WEIGHTS["search"]


def test_more_submitted_than_expected_raises_the_total() -> None:
    clock, events = FakeClock(), []
    tracker = Tracker(events.append, clock)
    with tracker.phase("ladder", 2) as ph:
        Counted(FakeEvaluator(clock, 1.0), ph).map(list(range(5)))
    totals = [e.total for e in events]
    assert max(totals) == 5 and events[-1].done == 5 and all(e.done <= e.total for e in events)


def test_worker_thread_events_reach_the_callback_on_the_calling_thread() -> None:
    clock, events, threads = FakeClock(), [], []
    tracker = Tracker(lambda e: (events.append(e), threads.append(threading.get_ident())), clock)

    def work() -> None:
        with tracker.phase("cost lines", 4) as ph:
            Counted(FakeEvaluator(clock, 1.0), ph).map([1, 2, 3, 4])

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert events == []  # held until the caller flushes
    tracker.flush()
    assert set(threads) == {threading.get_ident()}
    assert events[-1].finished and events[-1].done == events[-1].total == 4


def test_plain_lines_every_few_seconds_with_the_counts() -> None:
    clock, out = FakeClock(), io.StringIO()
    show = PlainLines(out, every_s=5.0, clock=clock)

    def event(done: int, finished: bool = False) -> ProgressEvent:
        return ProgressEvent("cost lines", done, 120, clock.t - 100.0, None if not done else (120 - done) * 1.0,
                             0.3, finished)

    show(event(0))
    for done in range(1, 35):
        clock.t += 0.5  # a simulation every half second: a line every 10 of them
        show(event(done))
    show(event(120, finished=True))
    show(event(120, finished=True))  # a repeated last event prints nothing
    lines = out.getvalue().splitlines()
    assert lines[0] == "cost lines: 0/120 simulations, ETA ..."
    assert lines[1] == "cost lines: 10/120 simulations, ETA 1 min 50 s"
    assert lines[2:-1] == ["cost lines: 20/120 simulations, ETA 1 min 40 s",
                           "cost lines: 30/120 simulations, ETA 1 min 30 s"]
    assert lines[-1] == "cost lines: 120/120 simulations, done in 17 s" and len(lines) == 5


def test_duration_text() -> None:
    assert [duration_text(s) for s in (0, 40.4, 59.6, 185)] == ["0 s", "40 s", "1 min 00 s", "3 min 05 s"]


def test_piped_cli_prints_plain_progress_lines_on_stderr(monkeypatch) -> None:
    import advisor.advise

    def fake(workload, request, *, progress=None, source=None):
        for done in (0, 17, 34):
            progress(ProgressEvent("cost lines", done, 34, float(done), 10.0 if done else None, 0.5,
                                   finished=done == 34))
        raise ValueError("stop here: the progress is what this test reads")

    monkeypatch.setattr(advisor.advise, "advise", fake)
    res = CliRunner().invoke(app, ["advise", "-w", "chat-production"])
    assert "cost lines: 0/34 simulations, ETA ..." in res.stderr
    assert "cost lines: 34/34 simulations, done in 34 s" in res.stderr
    assert res.exit_code != 0


def test_terminal_progress_shows_a_row_per_phase_with_counts_and_eta(monkeypatch) -> None:
    from rich.console import Console

    from advisor.commands import advise as command

    buf = io.StringIO()
    monkeypatch.setattr(command, "plain_console", lambda stderr=False: Console(
        file=buf, force_terminal=True, width=120, markup=False, highlight=False))
    with command.progress_display() as show:
        show(ProgressEvent("search", 12, 46, 6.0, 17.0, 0.1, detail="screening"))
        show(ProgressEvent("search", 46, 46, 20.0, 0.0, 0.45, finished=True))
        show(ProgressEvent("cost lines", 3, 34, 1.0, 10.0, 0.5))
    out = buf.getvalue()  # the bars' last frame, drawn as they stop
    assert "search" in out and "46/46 simulations" in out
    assert "cost lines" in out and "3/34 simulations" in out and "ETA 10 s" in out
