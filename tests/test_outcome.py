import pytest

from harness.launcher.control.channel import Message
from harness.launcher.run.outcome import classify


def msg(kind, t, **body):
    return Message(kind, body, t)


def decide(messages, world=2, **kw):
    args = dict(world_size=world, done_kind="result", agent_succeeded=False, agent_failures={}, agent_error=None,
                kill_status=None, kill_reason="")
    args.update(kw)
    return classify(messages, **args)


def test_success_needs_every_ranks_report():
    done = [msg("result", 1, rank=0), msg("result", 1, rank=1)]
    assert decide(done, agent_succeeded=True).status == "ok"
    half = decide(done[:1], agent_succeeded=True)
    assert half.status == "crashed" and "rank(s) 1 exited without reporting" in half.reason


def test_a_ranks_own_error_beats_the_echo_on_its_peer():
    messages = [
        msg("error", 2.0, rank=0, status="crashed", reason="Connection closed by peer", cause="collective"),
        msg("error", 1.0, rank=1, status="crashed", reason="ValueError: boom", cause="exception", traceback="tb"),
    ]
    o = decide(messages, agent_failures={0: {"exitcode": 1}, 1: {"exitcode": 1}})
    assert (o.status, o.failing_rank, o.traceback) == ("crashed", 1, "tb") and "boom" in o.reason


def test_only_collective_errors_name_the_silent_rank():
    messages = [msg("error", 1.0, rank=0, status="crashed", reason="gloo timed out", cause="collective")]
    o = decide(messages, world=3, agent_failures={0: {"exitcode": 1}})
    assert o.status == "crashed" and o.failing_rank == 1 and "rank(s) 1, 2 stopped responding" in o.reason


def test_watchdog_kill_and_abort():
    assert decide([], kill_status="timeout", kill_reason="hard limit").status == "timeout"
    assert decide([msg("error", 1, rank=0, status="crashed", reason="x", cause="exception")],
                  kill_status="aborted", kill_reason="SIGINT").status == "aborted"


def test_diverged_and_invalid_pass_through():
    o = decide([msg("error", 1, rank=1, status="diverged", reason="loss became NaN", cause="rule")])
    assert o.status == "diverged"
    o = decide([msg("error", 1, rank=0, status="invalid", reason="bad", cause="contract")])
    assert o.status == "invalid"


def test_death_without_a_word():
    o = decide([], agent_failures={1: {"exitcode": -9, "signal": "SIGKILL"}})
    assert o.status == "crashed" and "rank 1 died (killed by SIGKILL: by the system, out of memory?)" in o.reason


def test_a_forged_error_report_cannot_claim_success_over_a_kill():
    """Error reports come from processes that run team code: one that says status "ok" while the
    watchdog kills the job is a crash, never a score."""
    forged = [msg("error", 1, rank=0, status="ok", reason="all fine", cause="exception")]
    o = decide(forged, kill_status="timeout", kill_reason="hard limit")
    assert o.status == "crashed"
    assert decide([msg("error", 1, rank=0, status="running", reason="", cause="rule")]).status == "crashed"
    # "aborted" means "run it again": a rank that says so before a bad ending must not get a free re-run
    assert decide([msg("error", 1, rank=0, status="aborted", reason="", cause="rule")]).status == "crashed"


def test_a_rank_that_died_on_its_own_is_named_before_its_peers_echo():
    """Rank 0 exited (7) before any report; rank 1's collective error is only the echo of it."""
    messages = [msg("error", 1.0, rank=1, status="crashed", reason="Connection closed by peer", cause="collective")]
    o = decide(messages, agent_failures={0: {"exitcode": 7}})
    assert (o.status, o.failing_rank, o.cause) == ("crashed", 0, "death")
    assert o.reason == "rank 0 died (exit code 7) without a report (then rank 1 failed in a collective)"


def test_a_silent_rank_the_agent_tore_down_stopped_responding_it_did_not_die_first():
    """A hung rank is ended by the agent's teardown (SIGTERM, then SIGKILL) after its peer's collective timeout."""
    messages = [msg("error", 1.0, rank=0, status="crashed", reason="gloo timed out", cause="collective")]
    for signal_name in ("SIGTERM", "SIGKILL"):
        o = decide(messages, agent_failures={0: {"exitcode": 1}, 1: {"exitcode": -15, "signal": signal_name}})
        assert o.failing_rank == 1 and "rank(s) 1 stopped responding" in o.reason and o.cause == "collective"


def test_an_nccl_error_without_a_gpu_is_the_teams_line_not_a_collective_failure(tmp_path, monkeypatch):
    """A script's hard-coded NCCL on a CPU track raised at train.py's init_process_group line: it was classed
    as a collective failure (a peer's), with the team's frame dropped. Without a GPU, NCCL cannot have
    communicated at all: the error is the code's, named at its line. With one, an NCCL error stays
    collective; so does a gloo failure (named without the line where the rank waited: the peer is the cause)."""
    from harness.ranks import process

    team = tmp_path / "team"
    team.mkdir()
    script = team / "train.py"
    script.write_text("def init():\n    raise RuntimeError('ProcessGroupNCCL is only supported with GPUs, no GPUs found!')\n"
                      "def peer_gone():\n    raise RuntimeError('[../gloo/transport/tcp/pair.cc:534] Connection closed by peer')\n")
    namespace: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    for gpu, call, cause in ((False, "init", "exception"), (False, "peer_gone", "collective"),
                             (True, "init", "collective")):
        monkeypatch.setattr(process, "_has_gpu", lambda: gpu)
        try:
            namespace[call]()
        except RuntimeError as exc:
            report = process.describe_failure(exc, team)
            # The job's device decides where it is known (a CPU track on a GPU node: the team's line), and
            # then no CUDA query is made (the scorer asks CUDA nothing).
            monkeypatch.setattr(process, "_has_gpu", lambda: pytest.fail("asked the host for a GPU"))
            on_track = process.describe_failure(exc, team, "cuda" if gpu else "cpu")
            assert on_track["cause"] == cause
            assert process.describe_failure(exc, team, "cpu")["cause"] == ("collective" if call == "peer_gone"
                                                                             else "exception")
        assert report["cause"] == cause, (gpu, call, report)
        assert report["reason"].startswith(f"{script}:") == (cause == "exception"), report["reason"]


def test_a_rank_started_after_the_launcher_ended_the_job_before_team_code_never_turns_the_kill_around():
    """The red team's race: the launcher ended a job while torch elastic's agent was still in its rendezvous (a cap
    broken by the submission's own copy); the agent then started a rank anyway, which found its job's cgroup gone
    and said so. That came after the kill and before any team code: the kill's status stands, never `crashed` (which
    the runner turns `aborted` for a rank that could not join its cgroup: a free re-run)."""
    late = msg("error", 5.0, rank=0, status="crashed", reason="this process could not join its job's cgroup",
               cause="sandbox")
    o = decide([late], world=1, kill_status="invalid", kill_reason="the ranks' private folder holds more",
               kill_at_s=4.0, started=False)
    assert (o.status, o.reason) == ("invalid", "the ranks' private folder holds more")
    # Once a rank got through the process group, its own error still explains the run, as before
    o = decide([late], world=1, kill_status="invalid", kill_reason="cap", kill_at_s=4.0, started=True)
    assert o.status == "crashed" and "could not join" in o.reason
    # And an error said before the kill is the rank's own
    early = msg("error", 3.0, rank=0, status="crashed", reason="boom", cause="exception")
    assert decide([early], world=1, kill_status="invalid", kill_reason="cap", kill_at_s=4.0, started=False).reason \
        == "rank 0: boom"
