"""Process memory from /proc (Linux): RSS, its anonymous/file split, and a resettable peak (VmHWM).

Sampling RSS with a thread (the seed notebook's 0.1 s psutil loop) misses short peaks by ~7%
(research/pytorch-memory-facts.md 4.1); the kernel's high-water mark does not.
"""
from __future__ import annotations

from pathlib import Path

_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")


def read_status() -> dict[str, int]:
    """Byte values of the RSS fields of /proc/self/status (empty off Linux)."""
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in _FIELDS:
                out[key] = int(rest.split()[0]) * 1024  # the kernel reports kB (KiB)
    except OSError:
        pass
    return out


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS ("5" to clear_refs, Linux >= 4.0). False where not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def read_vm_size() -> int:
    """Virtual address space mapped now (VmSize), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0
