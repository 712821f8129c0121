"""`harness check` through the CLI: accepted or rejected, with every problem at once."""

import pytest
import csv
import json
import uuid

import psutil

from conftest import FIXTURES, ROOT, TINY_TRACK, quick_track

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)


def _marked(proc, mark: str) -> bool:
    try:
        return proc.environ().get("HARNESS_TEST_MARK") == mark and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_a_good_submission_is_accepted_with_its_figures(cli):
    result = cli("check", str(ROOT / "submissions" / "baseline"), "--track", "paris2026")
    assert result.code == 0, result.out + result.err
    out = result.out
    assert "ACCEPTED" in out and "32 ranks x 8 x 256 x 1 = 65,536" in out
    assert "logits [8, 256, 32000]" in out and "causality         ok" in out
    assert "FLOPs per token" in out and "static screen     nothing to review" in out
    assert f"harness run {ROOT / 'submissions' / 'baseline'} --track paris2026" in out
    assert result.seconds < 60


@pytest.mark.parametrize("track", ["local", "local-text", "dev-gpu", "paris2026"])
def test_every_shipped_example_passes_the_check_of_every_built_in_track(cli, track):
    """A team starts by copying an example: each must be accepted wherever a team may take it (the template's
    position table was once sized to its training seq_len, and paris2026's 1024-token windows rejected it)."""
    from harness.tracks.spec import builtin_track_names

    assert track in builtin_track_names() and len(builtin_track_names()) == 4, "a built-in track is missing here"
    examples = sorted(p for p in (ROOT / "submissions").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert {p.name for p in examples} >= {"baseline", "minimal", "open_example"}
    for example in examples:
        result = cli("check", str(example), "--track", track)
        assert result.code == 0 and "ACCEPTED" in result.out, f"{example.name} on {track}:\n{result.out}{result.err}"


def test_every_problem_is_listed_at_once(cli):
    result = cli("check", str(FIXTURES / "bad_config"))
    assert result.code == 1
    assert "REJECTED: 2 problem(s)" in result.out
    assert "CONFIG has no `seq_len`" in result.out and "smaller than the track's vocabulary" in result.out
    # The organisers' command is what an accepted submission will face; a rejected one is not run at all.
    assert "organisers run" not in result.out and "harness run" not in result.out


def test_a_peeking_model_and_the_screen_are_reported(cli):
    result = cli("check", str(FIXTURES / "peeks_ahead"), "--json")
    assert result.code == 1
    report = json.loads(result.out)
    assert not report["accepted"] and "non-causal" in report["problems"][0]["problem"]
    mark = f"check-{uuid.uuid4()}"
    result = cli("check", str(FIXTURES / "orphan_child"), env={"HARNESS_TEST_MARK": mark})
    assert result.code == 0 and "[process] calls subprocess.Popen()" in result.out
    left = [p for p in psutil.process_iter() if _marked(p, mark)]
    assert left == [], "the process the submission started during the check outlived it"


def test_the_static_screen_names_what_a_reviewer_should_read(tmp_path):
    from harness.submission.screen import screen_source

    src = '''import os, time, socket, ctypes, threading
import harness
time.perf_counter = lambda: 0.0
open("/data/paris2026/chunk_0049.bin", "rb")
key = os.environ["HOME"]
weights = torch.load("extra.pt")
'''
    found = {(f.line, f.category) for f in screen_source(src, "s.py")}
    for expected in [(1, "network"), (1, "native code"), (1, "threads"), (2, "harness internals"), (3, "patching"),
                     (4, "file"), (4, "data paths"), (5, "environment"), (6, "loads weights")]:
        assert expected in found, expected


def test_a_near_miss_config_key_is_a_warning_not_a_rejection(cli):
    result = cli("check", str(FIXTURES / "config_typo"))
    assert result.code == 0, result.out + result.err
    assert "ACCEPTED" in result.out
    assert "WARNING: CONFIG key 'learnig_rate' is not one the harness reads; did you mean 'learning_rate'?" in result.out


def _copy_named(src, dest, name: str):
    import shutil

    shutil.copytree(src, dest)
    (dest / "submission.toml").write_text(f'[team]\nname = "{name}"\n')
    return dest


def test_a_team_name_another_folder_owns_is_refused_and_never_lands_among_its_runs(cli, tmp_path):
    """Attack: a second folder claims a team's name in its own submission.toml (and crashes on purpose): the board,
    which ranks a team's latest submission, showed the victim as the impostor's crash. The name belongs to the
    folder whose runs first used it: `check` rejects the claim naming that folder, and the run is `invalid`,
    recorded under its own folder's name; the victim stays ranked."""
    original = _copy_named(FIXTURES / "ok_bigram", tmp_path / "theirs", "Rapides")
    track = quick_track(tmp_path)
    first = cli("run", str(original), "--track", str(track))
    assert first.code == 0, first.err
    copy = _copy_named(FIXTURES / "syntax_error", tmp_path / "mine", "Rapides")
    checked = cli("check", str(copy))
    assert checked.code == 1 and "REJECTED" in checked.out
    assert "team name 'Rapides' belongs to folder 'theirs'" in checked.out, checked.out
    assert cli("check", str(original)).code == 0  # its own folder: accepted
    ran = cli("run", str(copy), "--track", str(track))
    assert ran.code == 1
    (record_path,) = (tmp_path / "runs" / "tiny").glob("mine~refused/*/run.json")  # a refused run's folder
    record = json.loads(record_path.read_text())
    assert record["status"] == "invalid" and "belongs to folder 'theirs'" in record["reason"]
    assert record["team"] == "mine" and record["identity"]["claimed"] == "Rapides"
    assert record["submission_dir"] == str(copy.resolve())
    # a queue's entry for the refused folder is settled by this record (never run again at every --resume)
    from harness.launcher.event.queue import FAILED, build_queue, state_of

    (entry,) = build_queue([str(copy)], seed=record["seed"], repeat=1, runs_root=tmp_path / "runs")
    assert state_of(entry, tmp_path / "runs" / "tiny", {}).state == FAILED
    assert cli("leaderboard", "--no-charts").code == 0
    board = list(csv.DictReader((tmp_path / "leaderboard" / "tiny.csv").open()))
    (rapides,) = [r for r in board if r["team"] == "Rapides"]
    assert rapides["rank"] == "1" and rapides["status"] == "ok"


def test_the_organisers_roster_names_each_folders_team_and_refuses_a_folder_not_on_it(cli, tmp_path):
    """With runs/roster.toml, the organiser's name for a folder ranks its runs whatever its submission.toml says,
    and a folder not on the roster is refused."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "roster.toml").write_text('[teams]\n"Les Rapides" = "theirs"\n')
    listed = _copy_named(FIXTURES / "ok_bigram", tmp_path / "theirs", "Someone Else")
    checked = cli("check", str(listed))
    assert checked.code == 0 and "ranked as 'Les Rapides', the organiser's roster name" in checked.out
    ran = cli("run", str(listed), "--track", str(quick_track(tmp_path)), "--no-leaderboard")
    assert ran.code == 0, ran.err
    (record_path,) = (tmp_path / "runs" / "tiny").glob("Les-Rapides/*/run.json")
    assert json.loads(record_path.read_text())["team"] == "Les Rapides"
    stranger = _copy_named(FIXTURES / "ok_bigram", tmp_path / "stranger", "Les Rapides")
    refused = cli("check", str(stranger))
    assert refused.code == 1 and "folder 'stranger' is not on the organiser's roster" in refused.out
    (tmp_path / "runs" / "roster.toml").write_text('[teams]\n"A" = "x"\n"B" = "x"\n')
    broken = cli("check", str(listed))
    assert broken.code == 1 and "folder 'x' is given to two teams" in broken.out


def _small_gpt(tmp_path, name: str, forward_patch: str = "") -> str:
    """The benchmark's GPT (benchmarks/gpt_event_size) at a smaller width, at the event's vocabulary and length."""
    src = (ROOT / "benchmarks" / "gpt_event_size" / "submission.py").read_text()
    src = src.replace('"n_layer": 12, "n_head": 12, "n_embd": 768', '"n_layer": 2, "n_head": 4, "n_embd": 128')
    if forward_patch:  # a model that needs real values: it cannot run on the meta device
        src = src.replace("        T = idx.size(1)\n", "        T = idx.size(1)\n" + forward_patch)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "submission.py").write_text(src)
    return str(folder)


def test_the_check_at_the_events_sizes_does_its_arithmetic_small(cli, tmp_path):
    """Shapes at the real micro-batch and FLOPs on the meta device; for real only batch 1 and a short
    causality window (benchmarks/check_size.py times the 124M version)."""
    from harness.ranks.flops import count_training_flops_per_token
    from harness.ranks.models.preflight import CAUSALITY_WINDOW

    result = cli("check", _small_gpt(tmp_path, "gpt_small"), "--track", "paris2026", "--json")
    assert result.code == 0, result.out + result.err
    r = json.loads(result.out)
    assert r["shapes_on"] == "meta" and r["logits_shape"] == [16, 1024, 32768] and r["real_batch"] == 1
    assert r["initial_loss"] is not None and "values_checked" not in r  # 111M: under the CPU's limit, checked for real
    assert r["causality"]["positions"] == [0, CAUSALITY_WINDOW // 4, CAUSALITY_WINDOW // 2, CAUSALITY_WINDOW - 2]
    assert set(r["check_timings_s"]) == {"meta_s", "build_s", "step_s", "eval_length_s", "causality_s"}
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpt_small", tmp_path / "gpt_small" / "submission.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    counted = count_training_flops_per_token(lambda: mod.get_model(dict(mod.CONFIG)), 32768, 16, 1024)
    assert r["flops_method"] == "meta" and r["flops_per_token"] == counted["flops_per_token"]


def test_a_model_that_needs_real_values_is_checked_for_real_at_batch_2(cli, tmp_path):
    folder = _small_gpt(tmp_path, "gpt_item", "        assert int(idx.max().item()) < self.wte.num_embeddings\n")
    result = cli("check", folder, "--track", "paris2026", "--json")
    assert result.code == 0, result.out + result.err
    r = json.loads(result.out)
    assert r["shapes_on"].startswith("cpu (") and r["real_batch"] == 2 and r["logits_shape"] == [2, 1024, 32768]
    assert r["flops_method"].startswith("cpu batch 1")


@pytest.mark.parametrize("forward", ["runs on meta", "needs real values"])
def test_a_billion_parameter_model_is_checked_by_its_shapes_in_little_memory(tmp_path, forward):
    """Issue 31's target: `harness check` of a 1B-parameter model on a CPU within 2 GiB (and 60 s: timed by
    benchmarks/check_size.py, not here). Its float32 weights and gradients (7.3 GiB) are past
    VALUES_MAX_GIB_ON_CPU: shapes and FLOPs are checked on the meta device, a parameter it saw no gradient for is a
    warning, and the check says who sees the values (on paris2026, the run's own check on the GPU). A forward that
    needs real values (`.item()`) cannot run on the meta device: its build alone is checked, in as little memory,
    never the real pass at batch 2 (tens of GiB here). The peak is the largest process of the command's tree."""
    import subprocess
    import sys

    from conftest import HARNESS_SCRIPT

    folder = tmp_path / "gpt1b"
    folder.mkdir()
    src = (ROOT / "benchmarks" / "gpt_event_size" / "submission.py").read_text()
    src = src.replace('"n_layer": 12, "n_head": 12, "n_embd": 768', '"n_layer": 24, "n_head": 16, "n_embd": 1792')
    # A parameter only a real device's branch uses: on the meta device it gets no gradient. With no real backward
    # to agree, that is a warning, never a rejection (an honest model must not be caught by the meta device).
    src = src.replace("        self.ln_f = nn.LayerNorm(d)\n",
                      "        self.ln_f = nn.LayerNorm(d)\n        self.gain = nn.Parameter(torch.ones(()))\n")
    src = src.replace("        logits = self.head(self.ln_f(x))\n",
                      "        if x.device.type != 'meta':\n            x = x * self.gain\n"
                      "        logits = self.head(self.ln_f(x))\n")
    if forward == "needs real values":
        src = src.replace("        T = idx.size(1)\n",
                          "        T = idx.size(1)\n        assert int(idx.max().item()) < self.wte.num_embeddings\n")
    (folder / "submission.py").write_text(src)
    measure = ("import json, resource, subprocess, sys\n"
               "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
               "print(json.dumps({'code': p.returncode, 'out': p.stdout, 'err': p.stderr,\n"
               "                  'peak_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))")
    ran = subprocess.run([sys.executable, "-c", measure, str(HARNESS_SCRIPT), "check", str(folder), "--track",
                          "paris2026", "--json"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    got = json.loads(ran.stdout)
    assert got["code"] == 0, got["out"] + got["err"]
    assert got["peak_kib"] < 2 * 2**20, got["peak_kib"]
    r = json.loads(got["out"])
    assert r["accepted"] and r["params"] == 985_961_985 and r["initial_loss"] is None and r["causality"] is None
    assert set(r["check_timings_s"]) == {"meta_s"}
    if forward == "runs on meta":
        assert any("1 trainable parameter(s) got no gradient on the meta device: gain" in w for w in r["warnings"])
        assert r["flops_method"] == "meta" and r["logits_shape"] == [16, 1024, 32768]
    else:
        assert r["logits_shape"] is None and r["flops_per_token"] is None
        assert "its forward cannot run on the meta device (RuntimeError on the meta device)" in r["values_checked"]
    # What `harness check` prints of that report (the same function renders it, without --json).
    from harness.launcher.run.check import CheckResult, render
    from harness.tracks.spec import load_track

    command = ["harness", "run", str(folder), "--track", "paris2026"]
    text = "\n".join(render(CheckResult(True, r, "gpt1b", load_track("paris2026"), command)))
    assert "values            not checked here: 985,961,985 parameters hold 7.3 GiB" in text, text
    assert "on track paris2026 the run's own check, on the GPU, sees them before training" in text
    by = "ITS SHAPES" if forward == "runs on meta" else "ITS BUILD"
    assert f"ACCEPTED BY {by}: this submission passes every check the harness could make here" in text, text


def test_a_get_model_that_returns_a_compiled_module_is_said_to_compile(cli, tmp_path):
    # As real Paris teams wrote it: no COMPILE, the model compiled inside get_model. The first training step
    # compiles on the clock, so check says so (it was reported as "compile": false), and checks it eagerly.
    folder = tmp_path / "compiled_in_get_model"
    folder.mkdir()
    source = (FIXTURES / "compiled_get_model" / "submission.py").read_text()
    (folder / "submission.py").write_text(source.replace("COMPILE = True\n", ""))
    report = json.loads(cli("check", str(folder), "--track", str(TINY_TRACK), "--json").out)
    assert report["accepted"] and report["compile"] is True and report["compiled_by_get_model"] is True
    text = cli("check", str(folder), "--track", str(TINY_TRACK)).out
    assert "compile           yes (get_model returns a torch.compile'd module): the first training step compiles" in text
    plain = json.loads(cli("check", str(FIXTURES / "ok_bigram"), "--track", str(TINY_TRACK), "--json").out)
    assert plain["compile"] is False and plain["compiled_by_get_model"] is False


def test_a_screen_larger_than_the_pipe_neither_blocks_the_check_nor_floods_the_report(cli, tmp_path):
    # 1,200 lines for a reviewer: once more than a pipe holds (64 KiB), the check process blocked on its
    # write while the launcher waited for it to exit, until the 300 s timeout rejected it.
    import shutil
    import time

    folder = tmp_path / "much_to_review"
    shutil.copytree(FIXTURES / "ok_bigram", folder)
    (folder / "helpers.py").write_text("".join(f"def read_{i}(path):\n    return open(path).read()\n\n"
                                               for i in range(1200)))
    t0 = time.monotonic()
    checked = cli("check", str(folder), "--track", str(TINY_TRACK), "--json")
    assert checked.code == 0, checked.text
    assert time.monotonic() - t0 < 120  # far from the 300 s timeout it used to run into
    screen = json.loads(checked.out)["screen"]
    more = int(screen[-1]["what"].split()[0])  # the 1,200 and what the fixture has of its own, less the 500 listed
    assert len(screen) == 501 and more >= 700 and screen[-1]["what"].endswith("more finding(s) not listed")


def test_one_file_nested_too_deep_to_screen_hides_no_other_files_findings(tmp_path):
    # A 450-deep attribute chain once made the whole screen one "screen failed: RecursionError" line that
    # named no file, and every finding of the other files was gone.
    import shutil

    from harness.submission.screen import screen_folder

    folder = tmp_path / "hides"
    shutil.copytree(FIXTURES / "frame_walk", folder)
    honest = screen_folder(folder)
    (folder / "zz_util.py").write_text("def f(a):\n    return a" + ".b" * 5000 + "\n")
    screened = screen_folder(folder)
    assert [f for f in screened if f["file"] != "zz_util.py"] == honest and honest
    (unscreened,) = [f for f in screened if f["file"] == "zz_util.py"]
    assert unscreened["category"] == "unscreened" and "a reviewer must read this file" in unscreened["what"]
