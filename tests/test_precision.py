"""``training.precision: auto | fp32 | bf16``: auto resolves to bf16 only where the device computes bf16 natively
(:mod:`secure_fed.hardware`), an explicit bf16 where it is emulated warns once with the measured slowdown, the run
records the resolved precision and ``validate`` prints it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from secure_fed import hardware
from secure_fed.cli import main
from secure_fed.config import build_plan, load_plan
from secure_fed.model_choices import precision_choice, precision_line
from tests.conftest import small_config


@pytest.fixture
def cpu(monkeypatch):
    """Set whether 'this CPU' computes bf16 natively; the warning's once-a-process memory starts empty."""
    monkeypatch.setattr(hardware, "_warned", set())

    def set_native(native: bool, flags=("avx512_bf16",)):
        monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags if native else ("avx2", "fma")))

    return set_native


@pytest.mark.parametrize(("native", "expected"), [(True, "bf16"), (False, "fp32")], ids=["native-bf16-cpu", "avx2-only-cpu"])
def test_auto_on_cpu_is_bf16_only_where_native(cpu, native, expected):
    cpu(native)
    assert hardware.resolve_precision("auto", "cpu") == expected
    assert hardware.resolve_precision("fp32", "cpu") == "fp32"  # explicit values as asked, whatever the CPU
    assert hardware.resolve_precision("bf16", "cpu") == "bf16"


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
def test_either_native_flag_counts(cpu, flag):
    cpu(True, flags=("avx2", flag))
    assert hardware.resolve_precision("auto", "cpu") == "bf16"


@pytest.mark.parametrize(("supported", "expected"), [(True, "bf16"), (False, "fp32")])
def test_auto_on_cuda_asks_the_cuda_probe(cpu, monkeypatch, supported, expected):
    cpu(not supported)  # the CPU's answer is the opposite one: only the CUDA probe may decide for a CUDA device
    monkeypatch.setattr(hardware, "cuda_native_bf16", lambda: supported)
    assert hardware.resolve_precision("auto", "cuda") == expected
    assert hardware.resolve_precision("auto", "mps") == "fp32"  # no probe: fp32


def test_cpu_flags_read_from_cpuinfo(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    monkeypatch.setattr(hardware, "_CPUINFO", info)
    hardware.cpu_flags.cache_clear()
    try:
        assert hardware.cpu_flags() == {"fpu", "avx2", "avx512f", "avx512_bf16"}
        assert hardware.cpu_native_bf16()
        info.write_text("flags\t\t: fpu avx2 fma\n")
        hardware.cpu_flags.cache_clear()
        assert not hardware.cpu_native_bf16()
    finally:
        hardware.cpu_flags.cache_clear()


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="fp16"):
        hardware.resolve_precision("fp16", "cpu")


def test_emulated_bf16_warns_once_with_the_measured_ratio(cpu, capsys):
    cpu(False)
    hardware.warn_emulated_bf16("cpu", slowdown=lambda device: 41.7)
    hardware.warn_emulated_bf16("cpu", slowdown=lambda device: 41.7)  # a shadow run or a sweep's next run: no repeat
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: training.precision=bf16")
    assert "41.7×" in err[0] and "avx512_bf16" in err[0]


def test_native_bf16_does_not_warn(cpu, capsys):
    cpu(True)
    hardware.warn_emulated_bf16("cpu", slowdown=lambda device: pytest.fail("no benchmark where bf16 is native"))
    assert capsys.readouterr().err == ""


def test_the_benchmark_measures_a_positive_ratio():
    assert hardware.bf16_slowdown("cpu", size=32, repeats=2) > 0


def test_default_run_pins_fp32_and_new_configs_default_to_auto():
    """The embedded default's figures (the docs', the golden runs') stay fp32 on every machine."""
    assert load_plan(None).training.precision == "fp32"
    assert load_plan({}).training.precision == "auto"


def test_a_small_image_resnet_on_cpu_stays_fp32_under_auto(cpu):
    """bf16 CPU kernels break a ResNet on images of 16 px or less (choices.model_choice refuses an explicit bf16)."""
    cpu(True)
    cfg = load_plan({"model": {"name": "resnet18", "weights": "random"}, "device": "cpu"})
    small, large = (SimpleNamespace(feature_kind="image", image_shape=(3, s, s)) for s in (16, 64))
    assert precision_choice(cfg, small, "cpu") == "fp32"
    assert precision_choice(cfg, large, "cpu") == "bf16"


@pytest.mark.parametrize(("precision", "native", "trained"), [("auto", True, "bf16"), ("auto", False, "fp32"),
                                                            ("bf16", False, "bf16")])  # fmt: skip
def test_the_run_trains_in_and_records_the_resolved_precision(cpu, monkeypatch, capsys, tmp_path, precision, native, trained):
    from secure_fed.engine import Experiment

    cpu(native)
    monkeypatch.setattr(hardware, "bf16_slowdown", lambda device: 38.2)
    cfg = small_config("training.rounds=1", "evaluation.every=1", f"training.precision={precision}")
    exp = Experiment(build_plan(cfg), run_dir=tmp_path / "run")
    assert exp.local.precision == trained
    exp.run(progress=False)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["precision"] == trained
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: training.precision")]
    assert len(warnings) == (precision == "bf16")  # one line for an emulated explicit bf16, none otherwise
    assert all("38.2×" in w for w in warnings)


VALIDATE_LINES = {
    True: "precision: auto → bf16 on CPU (this CPU computes bf16 natively: avx512_bf16)",
    False: "precision: auto → fp32 on CPU (this CPU has none of avx512_bf16, amx_bf16: bf16 is emulated)",
}


@pytest.mark.parametrize(("native", "line"), VALIDATE_LINES.items())
def test_validate_prints_the_resolved_precision(cpu, capsys, tmp_path, native, line):
    cpu(native)
    (tmp_path / "c.yaml").write_text("device: cpu\ndataset: {synthetic: {num_train: 200, num_test: 50}}\n")
    assert main(["validate", str(tmp_path / "c.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(o.startswith(line) for o in out), out


def test_precision_line_for_a_gpu_and_for_explicit_values(cpu):
    cpu(False)
    assert precision_line(load_plan({"training": {"precision": "fp32"}})) == "precision: fp32"
    assert "decides when it starts" in precision_line(load_plan({"device": "cuda"}))
    assert "slower than fp32" in precision_line(load_plan({"device": "cpu", "training": {"precision": "bf16"}}))


def test_validate_foresees_fp32_for_a_small_image_resnet(cpu):
    """Images are not read by ``validate``: the line takes the side the config resizes them to."""
    cpu(True)
    mosaics = {"dataset": {"name": "digit_mosaics", "mosaics": {"grid": 1, "tile_size": 16}}, "device": "cpu"}
    cfg = load_plan({**mosaics, "model": {"name": "resnet18", "weights": "random"}})
    assert precision_line(cfg).startswith("precision: auto → fp32 on CPU")
    cfg = load_plan({**mosaics, "model": {"name": "mlp"}})
    assert precision_line(cfg).startswith("precision: auto → bf16 on CPU")
