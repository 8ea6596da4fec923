"""What ``secure-fed validate`` checks after a config loads, as lines to print (torch-free).

:func:`validation_lines` is the command's whole path short of training: the configured files, the data and the
partition the run makes, each listed layer's plan (the DP layer's σ, calibrated to the target ε by the layer's own
functions, its planned steps and ε) and the memory estimate. Bad input ends in a
:class:`~secure_fed.errors.SecureFedError` (the command's one ``error:`` line), never another exception; the
property-based test of the privacy and protocol sections (``tests/config/test_config_sections_property.py``) calls
it in process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from secure_fed.plan import RunPlan


def validation_lines(plan: RunPlan, data_root: str | None = None, *, source: str = "config") -> Iterator[str]:
    """The lines ``secure-fed validate`` prints for the loaded config's ``plan``, each yielded once its check has
    passed (so a refusal comes after the lines of the checks before it, as the command prints them)."""
    from secure_fed.data.from_config import build_dataset, check_data_files  # torch-free: validate stays fast
    from secure_fed.model_choices import IMAGE_FORMATS

    check_data_files(plan.dataset, data_root)  # a data file that is not there: its error line, and no "valid" before it
    d = plan.dataset
    images = d.name == "digit_mosaics" or d.format in IMAGE_FORMATS
    # data that cannot be read, or a partition that cannot be made: the run's own error line (exit 2), before "valid"
    ds = None if images else build_dataset(plan, data_root)
    shards = None
    if ds is not None:
        import numpy as np

        from secure_fed.data import partitioner_from_config

        # the partition the run makes (e.g. a natural partition's client-id file is read and checked against the data)
        shards = partitioner_from_config(plan.partition, seed=plan.seed).partition(
            ds.train, np.random.default_rng([plan.seed, 11])
        )
    data = f"{d.format} data at {d.train or d.root}" if d.format else d.name
    yield f"{source}: valid ({plan.algorithm.name} on {data}, {plan.training.rounds} rounds)"
    from secure_fed.model_choices import precision_line

    yield precision_line(plan, ds)
    from secure_fed.threads import env_threads_ceiling, threads_line, threads_record, usable_cpus

    clients = len(shards) if shards is not None else usable_cpus()  # image data unread: Flower's nodes fill the CPUs at most
    yield threads_line(threads_record(plan, clients, ceiling=env_threads_ceiling()))
    from secure_fed.memory import check_memory, needs_torch, plan_memory

    later = "`secure-fed run` makes it before training and refuses a run that cannot fit"
    if ds is None:
        yield f"memory estimate: not made here (image data are decoded with torch); {later}"
        return
    yield ds.describe()
    from secure_fed.plugin_specs import layer_specs

    for name in plan.protocols:
        spec = layer_specs().get(name)
        if spec is not None and spec.describe is not None:
            yield "\n".join(spec.describe(plan, len(shards)))
    if needs_torch(plan, ds):
        yield f"memory estimate: not made here (counting this model's parameters needs torch); {later}"
        return
    est = plan_memory(plan, ds, "cpu")  # validate checks host memory; a GPU run is checked when it starts there
    note = "" if plan.device == "cpu" else f" (device: {plan.device}: checked against GPU memory when the run starts on one)"
    yield f"estimated peak memory{note}:"
    yield "\n".join(est.lines())
    check_memory(est)  # the run's own refusal: one error line, exit 2
