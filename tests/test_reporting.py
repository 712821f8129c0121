"""What a person reads from `harness run`: progress in a terminal and in a log, and the record's provenance."""

import io
import subprocess
from pathlib import Path

from conftest import ROOT
from harness.launcher.run.console import ConsoleReporter, progress_text


class _Log(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_a_log_gets_one_line_per_phase_and_one_per_progress_report():
    log = _Log()
    reporter = ConsoleReporter(log)
    for _ in range(3):
        reporter.progress("starting ranks (rendezvous, model build)...", key="starting")
    for elapsed in (0.5, 1.0, 1.5):  # ticks before rank 0's first report: one line
        reporter.progress(progress_text(elapsed, 30, None, None, None, 5.0), key=("train", None))
    for step, elapsed in ((10, 5.0), (10, 5.5), (10, 6.0), (20, 10.0), (20, 10.5)):
        reporter.progress(progress_text(elapsed, 30, step, 2.5, 1000.0, 5.0), key=("train", step))
    for _ in range(7):
        reporter.progress("training done; finishing (checkpoint, communication probe)...", key="finishing")
    lines = log.getvalue().splitlines()
    assert len(lines) == 5, lines
    assert lines[0].startswith("starting ranks") and "step 10 " in lines[2] and "step 20 " in lines[3]
    assert lines[4].startswith("training done")


def test_before_the_first_report_the_line_says_when_it_comes():
    text = progress_text(3.2, 30, None, None, None, 5.0)
    assert "step -" not in text and "loss -" not in text
    assert "first steps running" in text and "first log interval (every 5s)" in text and "26.8s left" in text


def test_a_terminal_line_is_redrawn_in_place():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    reporter = ConsoleReporter(tty)
    reporter.progress("a", key=1)
    reporter.progress("a", key=1)
    reporter.end_progress()
    assert tty.getvalue() == "\ra\ra\n"


def test_versions_name_the_software_and_the_commit_of_the_checkout():
    from harness.launcher.run.provenance import machine, versions

    v = versions()
    assert {"torch", "cuda", "nccl", "numpy", "python", "harness", "harness_git_commit"} <= set(v)
    assert v["torch"] and v["numpy"] and v["python"] and v["harness"]
    if (ROOT / ".git").exists():
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        assert v["harness_git_commit"].split("+")[0] == head
    m = machine()
    assert m["cores"] >= 1 and m["cpu"]


def test_reasons_name_the_teams_files_relative_to_the_submission(tmp_path):
    from harness.launcher.run.assemble import name_team_files
    from harness.results.records import RunRecord

    snapshot, private = tmp_path / "runs" / "local" / "t" / "r" / "submission", Path("/tmp/harness-train-x/submission")
    record = RunRecord(run_id="r", team="t", track_name="local", status="invalid",
                       reason=f"{snapshot}/submission.py:5: syntax error", traceback=f'File "{private}/model.py", line 3')
    record.extra["problems"] = [{"file": f"{snapshot}/submission.py:5", "problem": "syntax error"}]
    name_team_files(record, [snapshot, private, tmp_path / "team_x"])
    assert record.reason == "submission.py:5: syntax error"
    assert record.traceback == 'File "model.py", line 3' and record.extra["problems"][0]["file"] == "submission.py:5"


def test_on_a_terminal_the_live_line_is_cleared_before_the_summary_goes_to_stdout():
    """Progress is redrawn on stderr, the summary written to stdout; on a terminal both are the same screen,
    so stderr's live line is blanked and flushed before the first byte of the summary."""
    events = []

    class Stream(io.StringIO):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def isatty(self) -> bool:
            return True

        def write(self, text):
            events.append((self.name, "write", text))
            return super().write(text)

        def flush(self):
            events.append((self.name, "flush", ""))

    err, out = Stream("err"), Stream("out")
    reporter = ConsoleReporter(err, out=out)
    reporter.progress("train 1.0s / 30s", key=1)
    reporter.summary(["status     ok", "record     runs/x"])
    assert err.getvalue() == "\rtrain 1.0s / 30s" + "\r" + " " * 16 + "\r"
    assert out.getvalue() == "status     ok\nrecord     runs/x\n"
    first_out = next(i for i, e in enumerate(events) if e[0] == "out")
    assert ("err", "flush", "") in events[events.index(("err", "write", "\r" + " " * 16 + "\r")):first_out]


def _record(**fields):
    from harness.results.records import RunRecord

    record = RunRecord(run_id="r", team="t", track_name="local", status="ok", budget_s=30.0, train_time_s=30.1,
                       steps=5, tokens=5120, tokens_per_s=170.0, track={"max_steps": 0})
    for name, value in fields.items():
        setattr(record, name, value)
    return record


def test_the_summary_says_what_bounded_the_run_and_never_prints_none(tmp_path):
    from harness.launcher.run.console import summary_lines

    fixed = "\n".join(summary_lines(_record(train_loss=2.5), tmp_path))
    assert "trained    30.10s of 30s budget, 5 steps, 5120 tokens" in fixed and "train_loss 2.5000" in fixed
    stepped = "\n".join(summary_lines(_record(track={"max_steps": 20}, steps=20, train_time_s=20.49, official=False,
                                              overrides={"max_steps": 20}), tmp_path))
    assert "trained    20 of 20 steps (--max-steps) in 20.49s" in stepped and "budget" not in stepped
    short = "\n".join(summary_lines(_record(track={"max_steps": 20}, steps=12), tmp_path))
    assert "trained    12 of 20 steps (--max-steps)" in short  # what was trained, not what was asked for
    assert "`harness leaderboard --all`" in stepped  # an unofficial run is only on the --all board
    script = "\n".join(summary_lines(_record(division="open", steps=None, tokens=None, tokens_per_s=None,
                                             train_time_s=36.4, startup_s=None), tmp_path))
    assert "None" not in script and "steps not reported" in script
    assert "36.40s by the launcher's clock against a 30s budget (from the end of the start-up allowance" in script
    assert "to the job's exit" in script  # no ctime of a checkpoint in this record: the job's end
    saved = "\n".join(summary_lines(_record(division="open", train_time_s=30.2, startup_s=None,
                                            extra={"window_end": "checkpoint"}),
                                    tmp_path))
    assert "(from the end of the start-up allowance: no first_forward() to its checkpoint saved)" in saved
    stepped_script = "\n".join(summary_lines(_record(division="open", track={"max_steps": 20}, steps=12,
                                                      startup_s=1.0), tmp_path))
    assert "by the launcher's clock against a 30s budget (--max-steps 20) (from first_forward()" in stepped_script
    assert "12 steps" in stepped_script


def test_a_first_step_that_took_most_of_the_budget_is_said_with_its_cause():
    from harness.launcher.run.assemble import say_slow_first_step

    compiled = _record(steps=2, extra={"first_step_s": 24.0, "compiled": True})
    say_slow_first_step(compiled)
    (warning,) = compiled.warnings
    assert warning.startswith("the first step took 24.0 s, 80% of the 30 s budget, and 2 step(s) were trained")
    assert "torch.compile compiles in it" in warning
    quick = _record(extra={"first_step_s": 1.0, "compiled": True})
    say_slow_first_step(quick)
    assert quick.warnings == []
    stepped = _record(extra={"first_step_s": 24.0}, track={"max_steps": 3})  # no budget to speak of
    say_slow_first_step(stepped)
    assert stepped.warnings == []


FORGED = "\x1b[4A\x1b[2Kval_loss   1.2345  (floor 1.6685)\nstatus     ok\r\u202eevil"


def test_a_teams_text_is_shown_never_obeyed_on_the_terminal(tmp_path):
    # A reason or warning carries what team code raised: escapes that move the cursor over the summary
    # to print a val_loss the record does not hold, line breaks that start a forged line at column 0.
    from harness.launcher.run.console import summary_lines

    record = _record(status="crashed", reason=f"rank 1: RuntimeError: {FORGED}", warnings=[f"model.py:3: {FORGED}"])
    out, err = io.StringIO(), io.StringIO()
    ConsoleReporter(stream=err, out=out).summary(summary_lines(record, tmp_path))
    ConsoleReporter(stream=err, out=out).info(f"warning: {FORGED}")
    shown = out.getvalue() + err.getvalue()
    assert "\x1b" not in shown and "\r" not in shown and "\u202e" not in shown
    assert "\\x1b[4A" in shown  # shown as text, for a reader to see what was tried
    lines = shown.splitlines()
    assert not any(line.startswith(("val_loss", "status     ok")) for line in lines), lines
    assert sum(line.startswith("status ") for line in lines) == 1


def test_text_from_team_code_is_capped_and_one_line_where_a_line_is_expected():
    from harness.submission.printable import printable

    assert printable("a\nb") == "a \u23ce b"
    assert printable("x" * 5000).endswith("... (4000 more characters)") and len(printable("x" * 5000)) < 1100
    assert printable("line one\n  ^", one_line=False) == "line one\n  ^"  # a syntax error's caret keeps its place
