"""Resuming a run whose checkpoint files are damaged or missing, or with settings that would change what the
checkpoint means, is one ``error:`` line, exit status 2, and nothing rewritten: never a silent restart from round 0,
never a fresh secret in place of a lost one (e.g. the server's DP noise key), never a run continued as another."""

from __future__ import annotations

import shutil

import pytest

from tests.config.test_bad_input import assert_one_error_line, cli
from tests.conftest import SMALL

DP = ["protocols=[dp]", 'privacy.client={"clip_norm": 1.0, "noise_multiplier": 1.0}', "algorithm.name=fedaws"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-round run with client-level DP (the server holds a noise secret in server_secrets.pt)."""
    run = tmp_path_factory.mktemp("resume") / "run"
    sets = [x for s in [*SMALL, "training.rounds=2", *DP] for x in ("--set", s)]
    code, _, err = cli("run", *sets, "--out", str(run))
    assert code == 0, err
    return run


def _copy(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    return run


def _unchanged(run):
    return {p.name: p.stat().st_mtime_ns for p in [run / "summary.json", run / "metrics.jsonl"]}


@pytest.mark.parametrize("name", ["last.pt", "clients.pt", "server_secrets.pt"])
def test_a_damaged_checkpoint_file_is_one_line_naming_it(finished, tmp_path, name):
    run = _copy(finished, tmp_path)
    (run / "private" / "checkpoints" / name).write_bytes(b"garbage")
    before = _unchanged(run)
    assert_one_error_line(*cli("resume", str(run), "--set", "training.rounds=3")[::2], name, "not a readable checkpoint")
    assert _unchanged(run) == before


@pytest.mark.parametrize("name", ["clients.pt", "server_secrets.pt"])
def test_a_missing_secrets_file_is_refused_not_replaced_by_a_fresh_secret(finished, tmp_path, name):
    run = _copy(finished, tmp_path)
    (run / "private" / "checkpoints" / name).unlink()
    before = _unchanged(run)
    assert_one_error_line(*cli("resume", str(run), "--set", "training.rounds=3")[::2], name, "missing")
    assert _unchanged(run) == before


def test_a_finished_run_whose_last_checkpoint_is_gone_does_not_restart_from_round_0(finished, tmp_path):
    run = _copy(finished, tmp_path)
    (run / "private" / "checkpoints" / "last.pt").unlink()
    before = _unchanged(run)
    assert_one_error_line(*cli("resume", str(run), "--set", "training.rounds=3")[::2], "last.pt is missing")
    assert _unchanged(run) == before


@pytest.mark.parametrize(
    "change, needle",
    [("algorithm.name=fedalc", "algorithm.name: 'fedaws' there, 'fedalc' now"),
     ("seed=7", "seed: 0 there, 7 now"),
     ('privacy.client={"clip_norm": 1.0, "noise_multiplier": 0.5}', "privacy.client")],
)  # fmt: skip
def test_resume_refuses_settings_that_change_what_the_checkpoint_means(finished, tmp_path, change, needle):
    run = _copy(finished, tmp_path)
    before = _unchanged(run)
    assert_one_error_line(*cli("resume", str(run), "--set", change)[::2], "cannot resume", needle)
    assert _unchanged(run) == before


def test_resume_may_change_the_rounds_and_the_learning_rates(finished, tmp_path):
    run = _copy(finished, tmp_path)
    code, out, err = cli("resume", str(run), "--set", "training.rounds=3", "--set", "training.client_lr=0.001")
    assert code == 0, err
    assert "resuming" in out


@pytest.mark.parametrize("out", ["", "elsewhere"])
def test_out_with_resume_or_empty_is_one_line(finished, tmp_path, out):
    run = _copy(finished, tmp_path)
    args = ["run", "--out", out] if out == "" else ["run", "--resume", str(run), "--out", str(tmp_path / out)]
    assert_one_error_line(*cli(*args)[::2], "--out")
    assert not (tmp_path / "elsewhere").exists()


def test_a_dp_run_that_released_rounds_before_losing_its_checkpoints_does_not_start_again(finished, tmp_path):
    """Training again from round 0 with a fresh ledger would spend the budget twice and report it once."""
    run = _copy(finished, tmp_path)
    for f in ("private/checkpoints/last.pt", "private/checkpoints/final.pt", "summary.json"):
        (run / f).unlink()
    assert_one_error_line(*cli("resume", str(run), "--set", "training.rounds=3")[::2], "spend its privacy budget twice")


def test_checkpoint_files_of_two_rounds_are_refused(finished, tmp_path):
    """A crash between the moves of one checkpoint's files would pair last.pt with another round's clients.pt."""
    import torch

    run = _copy(finished, tmp_path)
    clients = run / "private" / "checkpoints" / "clients.pt"
    state = torch.load(clients, weights_only=False)
    torch.save({**state, "round": state["round"] - 1}, clients)
    assert_one_error_line(*cli("resume", str(run), "--set", "training.rounds=3")[::2], "last.pt is of round 2",
                          "clients.pt of round 1")  # fmt: skip


def test_a_run_without_dp_and_without_a_checkpoint_starts_again(tmp_path):
    run = tmp_path / "run"
    sets = [x for s in [*SMALL, "training.rounds=2"] for x in ("--set", s)]
    assert cli("run", *sets, "--out", str(run))[0] == 0
    for f in ("private/checkpoints/last.pt", "private/checkpoints/final.pt", "summary.json"):
        (run / f).unlink()
    code, out, err = cli("resume", str(run))
    assert code == 0, err
    assert "starting from round 0" in out


def test_a_second_process_writing_into_a_run_directory_in_use_is_refused(finished, tmp_path):
    """A resume started while the run still goes would interleave the two processes' checkpoints (the audit saw a
    traceback from a checkpoint file moved away under it): the run directory is locked while a run writes."""
    import subprocess
    import sys

    run = _copy(finished, tmp_path)
    holder = subprocess.Popen(  # another process holds the run directory, as a running run does
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from secure_fed.engine.checkpoint_commit import "
         "lock_run_dir\nwith lock_run_dir(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)", str(run)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        before = _unchanged(run)
        assert_one_error_line(*cli("resume", str(run), "--set", "training.rounds=3")[::2], "in use by another")
        assert _unchanged(run) == before
    finally:
        holder.kill()
        holder.wait()
    code, _, err = cli("resume", str(run), "--set", "training.rounds=3")  # the lock ends with its process
    assert code == 0, err
