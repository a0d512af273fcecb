"""Peak resident memory of the current process, for benchmark scripts (no dependencies)."""


def peak_rss_mb() -> float:
    """VmHWM of this process in MiB (ru_maxrss would include the parent's peak inherited at fork)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")
