"""What the hardware runs fast: bf16 autocast and channels_last where the matrix units take
bf16 natively (CUDA GPUs; CPUs with AVX512-BF16 or AMX), fp32 elsewhere, where emulated bf16
would be slower. No torch import: the choice is made from the device type and the CPU flags."""

from __future__ import annotations

from pathlib import Path

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (Linux's /proc/cpuinfo; empty where it cannot be read)."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.partition(":")[2].split())
    return set()


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    return any(flag in cpu_flags(cpuinfo) for flag in NATIVE_BF16_FLAGS)


def resolve_fast_math(
    amp: bool | str, channels_last: bool | str, *, cuda: bool, cpuinfo: str | None = None
) -> tuple[bool, bool, str]:
    """(bf16 autocast on?, channels_last on?, a line saying what was chosen and why) from the
    settings (``"auto"``, True or False) and the device."""
    native = cuda or cpu_has_native_bf16(cpuinfo)
    use_amp = native if amp == "auto" else bool(amp)
    use_channels_last = native if channels_last == "auto" else bool(channels_last)
    if cuda:
        where = "CUDA"
    elif native:
        where = "a CPU with native bf16 (AVX512-BF16 or AMX)"
    else:
        where = "a CPU without native bf16"
    chosen = [
        f"bf16 autocast {'on' if use_amp else 'off'}{' (auto)' if amp == 'auto' else ''}",
        f"channels_last {'on' if use_channels_last else 'off'}"
        f"{' (auto)' if channels_last == 'auto' else ''}",
    ]
    return use_amp, use_channels_last, f"{', '.join(chosen)} on {where}"
