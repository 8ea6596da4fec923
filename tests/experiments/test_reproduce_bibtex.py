import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
import reproduce_bibtex as rb  # noqa: E402


def test_method_labels_and_grid_expansion():
    jobs = rb.expand("fedavg,fedaws:10,fedalc:grid")
    assert jobs[0] == ("fedavg", "fedavg", None)
    assert jobs[1] == ("fedaws:10", "fedaws", 10.0)
    assert [j[0] for j in jobs[2:]] == [f"fedalc:{x}" for x in (1, 10, 100, 150, 200, 500)]
    with pytest.raises(SystemExit, match="unknown method"):
        rb.expand("fedsgd")


def _fake_run(root: Path, name: str, p1: float):
    d = root / "runs" / name
    d.mkdir(parents=True)
    final = {"P@1": p1, "P@3": p1 / 2, "P@5": p1 / 3}
    (d / "summary.json").write_text(
        json.dumps(
            {
                "status": "completed",
                "rounds_completed": 5,
                "final": final,
                "wall_seconds": 1.0,
                "seconds_per_round": 0.2,
                "W_mean_cos": 0.3,
            }
        )
    )
    (d / "metrics.jsonl").write_text(json.dumps({"round": 5, **final, "W_mean_cos": 0.3}) + "\n")


def test_outputs_aggregate_seeds_and_compare_methods(tmp_path):
    for seed, (a, c) in enumerate([(40.0, 50.0), (42.0, 52.0)]):
        _fake_run(tmp_path, f"fedaws-lam10-seed{seed}", a)
        _fake_run(tmp_path, f"fedalc-lam10-seed{seed}", c)
    rb.write_outputs(tmp_path, ["fedaws:10", "fedalc:10"])
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["fedaws:10"]["P@1"] == pytest.approx(41.0) and res["fedaws:10"]["seeds"] == [0, 1]
    assert res["fedalc:10"]["paper"]["P@1"] == 59.67
    table = (tmp_path / "table.md").read_text()
    assert "| 10 | 41.00 ± 1.41 | 51.00 ± 1.41 | +10.00 | 2 | 26.79 | 59.67 |" in table
    assert res["fedalc:10"]["best_P@1"] == pytest.approx(51.0) and res["fedalc:10"]["best_round"] == [5, 5]
    assert (tmp_path / "p_at_1.png").stat().st_size > 1000
