"""Who a run is (harness/launcher/run/identity.py): the organiser's roster, or the folder that first used a name."""

import os
import re

import pytest

from harness.launcher.run.identity import RosterError, name_owner, read_roster, resolve_identity
from harness.results.records import record_folder
from records_factory import make_run


def test_a_records_folder_is_its_resolved_name_never_a_dot():
    assert record_folder({"identity": {"folder": "team_x"}, "submission_dir": "."}) == "team_x"
    assert record_folder({"submission_dir": "/event/submissions/team_x/"}) == "team_x"
    assert record_folder({"submission_dir": "."}) == "" and record_folder({"submission_dir": ".."}) == ""
    assert record_folder({}) == ""


def test_a_run_started_from_inside_its_own_folder_is_its_folders(tmp_path, monkeypatch):
    """`harness run .` from inside the team's folder: its name is the folder's, and a record written before the
    folder was resolved (submission_dir ".") owns nothing."""
    runs, folder = tmp_path / "runs", tmp_path / "rapides"
    folder.mkdir()
    make_run(runs, "Rapides", 2.0, submission_dir=".", started_at="2026-11-29T09:00:00Z")
    make_run(runs, "Rapides", 2.1, seed=2, submission_dir=str(folder), started_at="2026-11-29T10:00:00Z")
    monkeypatch.chdir(folder)
    assert name_owner(runs, "Rapides")[0] == "rapides"
    assert resolve_identity(runs, "Rapides", folder.__class__(".")).refused == ""
    other = tmp_path / "mine"
    other.mkdir()
    refused = resolve_identity(runs, "Rapides", other)
    assert refused.name == "mine" and "belongs to folder 'rapides'" in refused.refused and "roster.toml" in refused.refused


@pytest.mark.parametrize("text, said", [
    ('teams = 3', "needs one table, [teams]"),
    ('[teams]\n"A" = "x"\n"B" = "x"\n', "is given to two teams"),
    ('[teams]\n"Team A" = "x"\n"Team-A" = "y"\n', "would share one records folder ('Team-A')"),
    ('[teams]\n"Team A" = "x"\n"team a" = "y"\n', "would share one records folder ('team-a')"),
    ('[teams]\n"A" = "sub/x"\n', "no path"),
    ('[teams]\n"A\\u200b" = "x"\n', "a plain team name"),
    ('[teams', "not valid TOML"),
])
def test_a_broken_roster_is_named_with_its_fix(tmp_path, text, said):
    (tmp_path / "roster.toml").write_text(text)
    with pytest.raises(RosterError, match=re.escape(said)):
        read_roster(tmp_path)
    os.remove(tmp_path / "roster.toml")
    assert read_roster(tmp_path) is None


def test_a_name_that_would_share_another_teams_records_folder_is_refused(tmp_path):
    """"Team-A" after "Team A" (another folder's): both names' records would be runs/<track>/Team-A/, one folder
    for two teams' runs and run ids. The second folder is refused, named with the name that owns the folder; the
    first folder may change its name's spelling, and a name with a folder of its own is free."""
    from harness.submission.contract import team_slug

    runs, owner, other = tmp_path / "runs", tmp_path / "alpha", tmp_path / "beta"
    owner.mkdir()
    other.mkdir()
    made = make_run(runs, "Team A", 2.0, submission_dir=str(owner))
    slug_dir = made.parent.with_name(team_slug("Team A"))
    made.parent.rename(slug_dir)  # where `harness run` puts a team's records
    refused = resolve_identity(runs, "Team-A", other)
    assert refused.name == "beta", refused
    assert "would share its records folder 'Team-A' with team 'Team A' of folder 'alpha'" in refused.refused
    assert resolve_identity(runs, "Team A", other).refused.startswith("team name 'Team A' belongs to folder 'alpha'")
    assert resolve_identity(runs, "Team-A", owner).refused == ""  # its own folder: the same records folder
    assert resolve_identity(runs, "Team B", other).refused == ""
    # names in other scripts keep their letters: two such teams never meet in one folder, nor in `team/`
    assert len({team_slug(n) for n in ("队伍一", "队伍二", "Команда", "Team Ä", "Team Ö", "team")}) == 6
    made = make_run(runs, "队伍一", 2.0, submission_dir=str(owner), seed=2)
    made.parent.rename(made.parent.with_name(team_slug("队伍一")))
    assert resolve_identity(runs, "队伍二", other).refused == ""
    assert len(team_slug("队" * 100).encode()) <= 200  # a folder name's bytes, whatever the script


def test_a_refused_run_never_shares_a_teams_records_folder(tmp_path):
    """Review of 2026-12-03: a folder named "Team-A" claiming "Team A" (owned by folder alpha) was refused, and
    recorded under its own folder's name, whose records folder is Team A's `Team-A/`. A refused run's records go
    to a folder no team name's slug can spell; an accepted run's stay in its name's."""
    from harness.submission.contract import team_slug

    runs, owner, impostor = tmp_path / "runs", tmp_path / "alpha", tmp_path / "Team-A"
    owner.mkdir()
    impostor.mkdir()
    made = make_run(runs, "Team A", 2.0, submission_dir=str(owner))
    made.parent.rename(made.parent.with_name(team_slug("Team A")))
    refused = resolve_identity(runs, "Team A", impostor)
    assert refused.name == "Team-A" and refused.refused
    assert refused.records_folder == "Team-A~refused" != team_slug("Team A")
    assert all("~" not in team_slug(n) for n in ("a~refused", "Team-A~refused", "~", "x ~ y"))
    assert resolve_identity(runs, "Team A", owner).records_folder == "Team-A"
    # the queue settles the refused folder's entry by the records where its runs go
    import shutil

    from conftest import FIXTURES
    from harness.launcher.event.queue import build_queue

    shutil.copy(FIXTURES / "ok_bigram" / "submission.py", impostor / "submission.py")
    (impostor / "submission.toml").write_text('[team]\nname = "Team A"\n')
    (entry,) = build_queue([str(impostor)], seed=1, repeat=1, runs_root=runs)
    assert (entry.team, entry.records_folder) == ("Team-A", "Team-A~refused")
    (runs / "roster.toml").write_text('[teams]\n"Team A" = "alpha"\n')
    assert resolve_identity(runs, "whatever", impostor).records_folder == "Team-A~refused"  # not on the roster


def test_a_scaling_measure_is_refused_a_name_another_folder_owns(tmp_path):
    """Review of 2026-12-03: `harness scale` took the name its submission.toml claims, and wrote its scale.json into
    the owner's records folder, shown on the board's scaling view as the owner's. It is held to who the team is, as a
    run is, before anything is measured or written."""
    import shutil

    from conftest import FIXTURES, TINY_TRACK
    from harness.launcher.scaling.scale import ScaleOptions, run_scale

    runs, owner, mine = tmp_path / "runs", tmp_path / "theirs", tmp_path / "mine"
    owner.mkdir()
    made = make_run(runs, "Rapides", 2.0, submission_dir=str(owner))  # runs/local/Rapides/<run id>
    shutil.copytree(FIXTURES / "ok_bigram", mine)
    (mine / "submission.toml").write_text('[team]\nname = "Rapides"\n')
    with pytest.raises(ValueError, match="not measured: team name 'Rapides' belongs to folder 'theirs'"):
        run_scale(ScaleOptions(submission=str(mine), track=str(TINY_TRACK), runs_dir=str(runs)))
    assert not (runs / "tiny").exists()  # nothing written for the claim, in the owner's folder or any
    assert [p.name for p in (runs / "local" / "Rapides").iterdir()] == [made.name]
