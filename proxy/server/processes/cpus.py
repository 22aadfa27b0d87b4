"""How many CPUs this process may use: what `workers = auto` starts.

`os.cpu_count()` is the machine's count, not the container's. The count that matters is the
smallest of:

- the CPU affinity mask (`sched_getaffinity`: `taskset`, cpusets, Kubernetes' static CPU
  manager);
- the cgroup CPU quota: v2 `cpu.max` (`QUOTA PERIOD`, or `max`), v1 `cpu.cfs_quota_us` /
  `cpu.cfs_period_us` (-1: none), on the process's own cgroup and every ancestor (a limit set
  on a parent applies too). A container's `--cpus 2` or a Kubernetes `limits.cpu: 2` is a
  quota of 2 CPUs.

A fractional quota rounds down (at least 1), as Go's automaxprocs does: a second worker on
1.5 CPUs would spend its time throttled, adding latency to every stream it holds.

No I/O beyond reading these files; the paths are parameters so that tests can build a tree.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")


def usable_cpus(
    *,
    affinity: int | None = None,
    root: Path = CGROUP_ROOT,
    self_cgroup: Path = SELF_CGROUP,
) -> int:
    """The CPUs this process may use (module doc): at least 1."""
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        affinity = affinity or os.cpu_count() or 1
    count = affinity
    quota = cgroup_quota(root=root, self_cgroup=self_cgroup)
    if quota is not None:
        count = min(count, max(1, math.floor(quota + 1e-9)))
    return max(1, count)


def resolve_workers(setting: int) -> int:
    """The `workers` setting as a number of processes (0 is `auto`)."""
    return setting if setting > 0 else usable_cpus()


def cgroup_quota(*, root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> float | None:
    """The tightest CPU quota, in CPUs, over this process's cgroup and its ancestors (v2 and
    v1); None when no quota applies or the files cannot be read."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            quotas += [q for d in _chain(root, path) if (q := _v2_quota(d)) is not None]
        elif "cpu" in controllers.split(","):
            for mount in _v1_mounts(root, controllers):
                quotas += [q for d in _chain(mount, path) if (q := _v1_quota(d)) is not None]
    return min(quotas) if quotas else None


def _chain(mount: Path, path: str) -> Iterator[Path]:
    """`mount/path` and each of its ancestors up to `mount`, where they exist. In a container
    with its own cgroup namespace `path` is `/` and `mount` is the container's cgroup; without
    one, `mount/path` may not exist and `mount` itself is what the container sees."""
    relative = PurePosixPath(path).relative_to("/") if path.startswith("/") else PurePosixPath()
    parts = relative.parts
    for depth in range(len(parts), -1, -1):
        folder = mount.joinpath(*parts[:depth])
        if folder.is_dir():
            yield folder


def _v1_mounts(root: Path, controllers: str) -> list[Path]:
    names = [controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"]
    return [root / name for name in dict.fromkeys(names) if (root / name).is_dir()]


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, _, period = (folder / "cpu.max").read_text().strip().partition(" ")
    except OSError:
        return None
    return _ratio(quota, period or "100000")


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = (folder / "cpu.cfs_quota_us").read_text().strip()
        period = (folder / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:  # `max`: no quota
        return None
    if quota_us <= 0 or period_us <= 0:  # v1's -1: no quota
        return None
    return quota_us / period_us
