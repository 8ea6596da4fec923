import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
import deploy_faults as df  # noqa: E402


def test_serverapp_status_reads_the_latest_serverapp_task(tmp_path):
    db = tmp_path / "superlink.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE task (task_id TEXT, type TEXT, pending_at TEXT, sub_status TEXT, details TEXT)")
        rows = [
            ("1", "flwr-serverapp", "2026-12-06 21:38:58+00:00", "failed", "No heartbeat received from the task"),
            ("2", "flwr-serverapp", "2026-12-06 22:24:02+00:00", "completed", None),
            ("3", "flwr-clientapp", "2026-12-06 22:30:00+00:00", "failed", "other"),
        ]
        c.executemany("INSERT INTO task VALUES (?, ?, ?, ?, ?)", rows)
    assert df.serverapp_status(db) == ("completed", "")
    with sqlite3.connect(db) as c:
        c.execute("UPDATE task SET sub_status = 'failed', details = 'No heartbeat received from the task' WHERE task_id = '2'")
    assert df.serverapp_status(db) == ("failed", "No heartbeat received from the task")
    assert df.serverapp_status(tmp_path / "none.db") is None


def _no_deployment(*a, **k):
    raise AssertionError("a deployment was started")


def test_the_driver_refuses_a_schedule_for_another_number_of_nodes_before_starting(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(df, "LocalDeployment", _no_deployment)
    schedule = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "faults" / "bibtex_fedalc_16_nodes.yaml"
    code = df.main(["--nodes", "8", "--schedule", str(schedule), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err == "error: the schedule has 16 nodes, --nodes 8\n"
    assert not (tmp_path / "out").exists()


def test_the_driver_refuses_missing_data_before_starting_a_deployment(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(df, "LocalDeployment", _no_deployment)
    empty = tmp_path / "no-data"
    empty.mkdir()
    schedule = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "faults" / "bibtex_fedalc_16_nodes.yaml"
    code = df.main(["--nodes", "16", "--schedule", str(schedule), "--out", str(tmp_path / "out"), "--set",
                    "dataset.name=bibtex", "--data-root", str(empty)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: dataset 'bibtex' not found") and err.count("\n") == 1, err
    assert str(empty / "mulan" / "bibtex" / "bibtex-train.arff") in err
    assert not (tmp_path / "out").exists()


def test_oom_kills_are_read_from_the_kernel_log_after_the_runs_start():
    log = (
        "[71961.553301] Out of memory: Killed process 9184 (flwr-serverapp) total-vm:5634916kB, anon-rss:2036456kB, "
        "file-rss:248kB, shmem-rss:0kB, UID:0 pgtables:5668kB oom_score_adj:0\n"
        "[75000.000001] eth0: link up\n"
        "[78827.218035] Out of memory: Killed process 19217 (flwr-serverapp) total-vm:5712328kB, anon-rss:2002696kB, "
        "file-rss:120kB, shmem-rss:0kB, UID:0 pgtables:5604kB oom_score_adj:1000\n"
    )
    assert df.oom_kills(log, 75000.0) == [{"t": 78827.218035, "pid": 19217, "name": "flwr-serverapp",
                                           "anon_rss_mib": 1955.8}]  # fmt: skip
    assert [k["pid"] for k in df.oom_kills(log, 0.0)] == [9184, 19217]
    assert df.oom_kills(log, 80000.0) == []
    cgroup = "[  12.500000] Memory cgroup out of memory: Killed process 7 (python) total-vm:1kB, anon-rss:2048kB, x"
    assert df.oom_kills(cgroup, 0.0) == [{"t": 12.5, "pid": 7, "name": "python", "anon_rss_mib": 2.0}]
