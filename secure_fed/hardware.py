"""What the hardware computes natively, for ``training.precision: auto``: whether a device multiplies bf16 matrices in
hardware (:func:`native_bf16`), the precision a requested one resolves to there (:func:`resolve_precision`), and the
one warning line an explicit bf16 gets where bf16 is emulated (:func:`emulated_bf16_warning`, with the measured
slowdown of a bf16 matrix product against fp32 in this process, :func:`bf16_slowdown`).

A CPU computes bf16 natively when its flags (``/proc/cpuinfo``) list ``avx512_bf16`` or ``amx_bf16``; without the
file (not Linux), torch's own probes decide (``torch.cpu._is_avx512_bf16_supported``, ``_is_amx_tile_supported``).
A CUDA device does when ``torch.cuda.is_bf16_supported()`` says so. Elsewhere bf16 is emulated: on an AVX2-only CPU
a bf16 matrix product ran about 40 times slower than fp32. The module is light: torch is imported only to ask about a
CUDA device, for the probes off Linux, and for the benchmark; reading the CPU flags needs nothing.
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

#: CPU flags (``/proc/cpuinfo``) of instructions that multiply bf16 values in hardware
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")

#: the values of ``training.precision``; ``auto`` resolves to one of the other two
PRECISIONS = ("auto", "fp32", "bf16")

_CPUINFO = Path("/proc/cpuinfo")


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """The CPU's flags from ``/proc/cpuinfo`` (its first ``flags`` line), or None where the file is not there."""
    try:
        text = _CPUINFO.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cpu_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX): its flags, else torch's probes."""
    flags = cpu_flags()
    if flags is not None:
        return any(f in flags for f in NATIVE_BF16_FLAGS)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    probes = (getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return any(bool(p()) for p in probes if p is not None)


def cuda_native_bf16() -> bool:
    """Whether the current CUDA device computes bf16 natively (``torch.cuda.is_bf16_supported``)."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False))


def native_bf16(device_type: str) -> bool:
    """Whether a device of this type (``cpu``, ``cuda``; anything else: no) computes bf16 natively."""
    if device_type == "cpu":
        return cpu_native_bf16()
    if device_type == "cuda":
        return cuda_native_bf16()
    return False


def resolve_precision(requested: str, device_type: str) -> str:
    """``fp32`` or ``bf16``: ``auto`` is bf16 where the device computes it natively, else fp32; the others as asked."""
    if requested not in PRECISIONS:
        raise ValueError(f"training.precision: {requested!r} is not one of {', '.join(PRECISIONS)}")
    if requested != "auto":
        return requested
    return "bf16" if native_bf16(device_type) else "fp32"


def bf16_slowdown(device_type: str = "cpu", size: int = 256, repeats: int = 5) -> float:
    """How many times longer a ``size``-square bf16 matrix product takes than the fp32 one on this device, each the
    best of ``repeats`` timed products (about 0.2 s on a CPU that emulates bf16)."""
    import torch

    device = torch.device(device_type)
    gen = torch.Generator().manual_seed(0)  # its own generator: the run's random streams are left as they are
    a = torch.randn(size, size, generator=gen).to(device)
    b = torch.randn(size, size, generator=gen).to(device)

    def best(x: torch.Tensor, y: torch.Tensor) -> float:
        times = []
        for _ in range(repeats + 1):  # the first product warms the kernel up and is not counted
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            x @ y
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        return min(times[1:])

    fp32 = best(a, b)
    return best(a.bfloat16(), b.bfloat16()) / max(fp32, 1e-9)


def emulated_bf16_warning(device_type: str, slowdown=None) -> str | None:
    """The warning line for an explicit ``training.precision: bf16`` on a device that does not compute bf16 natively
    (with the slowdown measured here), or None where it does."""
    if native_bf16(device_type):
        return None
    slowdown = slowdown or bf16_slowdown
    where = f"this CPU has none of {', '.join(NATIVE_BF16_FLAGS)}" if device_type == "cpu" else f"this {device_type} device"
    return (
        f"warning: training.precision=bf16 is emulated here ({where}): a 256×256 bf16 matrix product took "
        f"{slowdown(device_type):.1f}× the fp32 one; training.precision: auto (or fp32) trains in fp32 here"
    )


_warned: set[str] = set()


def warn_emulated_bf16(device_type: str, slowdown=None) -> None:
    """Print :func:`emulated_bf16_warning` to stderr, once a process for each device type (shadow runs, sweeps);
    ``slowdown``: the benchmark (:func:`bf16_slowdown` when None)."""
    if device_type in _warned:
        return
    _warned.add(device_type)
    if line := emulated_bf16_warning(device_type, slowdown):
        print(line, file=sys.stderr, flush=True)
