import sqlite3

import pytest
from flwr.supercore import constant, sql_mixin

from secure_fed.engine.flower import superlink_launcher as launcher


def test_with_busy_timeout_replaces_only_that_pragma():
    pragmas = (("busy_timeout", "5000"), ("journal_mode", "WAL"))
    assert launcher.with_busy_timeout(pragmas, 120_000) == (("busy_timeout", "120000"), ("journal_mode", "WAL"))
    assert launcher.with_busy_timeout((("journal_mode", "WAL"),), 9) == (("busy_timeout", "9"), ("journal_mode", "WAL"))
    with pytest.raises(ValueError, match="positive"):
        launcher.with_busy_timeout(pragmas, 0)


def test_flowers_own_connection_hook_sets_the_longer_timeout(monkeypatch, tmp_path):
    # restored after the test: the patch is process-wide
    monkeypatch.setattr(constant, "SQLITE_PRAGMAS", constant.SQLITE_PRAGMAS)
    monkeypatch.setattr(sql_mixin, "SQLITE_PRAGMAS", sql_mixin.SQLITE_PRAGMAS)
    conn = sqlite3.connect(tmp_path / "state.db")
    sql_mixin._set_sqlite_pragmas(conn, None)
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000  # Flower's default, which lost a node's reply
    launcher.install_busy_timeout(launcher.BUSY_TIMEOUT_MS)
    conn2 = sqlite3.connect(tmp_path / "state.db")
    sql_mixin._set_sqlite_pragmas(conn2, None)
    assert conn2.execute("PRAGMA busy_timeout").fetchone()[0] == launcher.BUSY_TIMEOUT_MS == 120_000
    assert conn2.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # Flower's other pragmas kept
    # ... and an engine Flower's SuperLink state opens itself (its object store) gets it
    from flwr.supercore.object_store.sql_object_store import SqlObjectStore
    from sqlalchemy import text

    store = SqlObjectStore(str(tmp_path / "objects.db"))
    store.initialize()
    with store._engine.connect() as c:
        assert c.execute(text("PRAGMA busy_timeout")).scalar() == 120_000


def test_main_installs_the_timeout_before_running_flower_superlink(monkeypatch):
    import flwr.superlink.cli as cli

    monkeypatch.setattr(constant, "SQLITE_PRAGMAS", constant.SQLITE_PRAGMAS)
    monkeypatch.setattr(sql_mixin, "SQLITE_PRAGMAS", sql_mixin.SQLITE_PRAGMAS)
    monkeypatch.setattr("sys.argv", ["/x/superlink_launcher.py", "--port", "1"])
    seen = {}

    def fake_superlink():
        import sys

        seen["pragmas"], seen["argv"] = dict(sql_mixin.SQLITE_PRAGMAS), list(sys.argv)
        return 0

    monkeypatch.setattr(cli, "flower_superlink", fake_superlink)
    with pytest.raises(SystemExit) as stop:
        launcher.main()
    assert stop.value.code == 0
    assert seen["pragmas"]["busy_timeout"] == "120000"
    assert seen["argv"] == ["flower-superlink", "--port", "1"]


def test_the_deployment_starts_the_superlink_through_the_launcher(tmp_path):
    from secure_fed.engine.flower.deployment import LocalDeployment

    dep = LocalDeployment(nodes=1, workdir=tmp_path)
    started = {}
    dep._certs = {"ca.crt": "ca", "server.pem": "pem", "server.key": "key"}
    dep._start = lambda name, cmd, env: started.setdefault(name, cmd)
    dep._wait_for = lambda *a, **k: None
    dep._output = lambda p: b""
    dep._start_superlink()
    assert started["superlink"][1:3] == ["-m", "secure_fed.engine.flower.superlink_launcher"]
