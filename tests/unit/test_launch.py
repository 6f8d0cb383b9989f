"""flows/launch.py: when `far` restarts itself with glibc's huge-page tunable, and that the
restart gives the process's large arrays huge pages (a child process: the tunable is read only
when a process starts)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows import launch
from tests.conftest import REPO

GLIBC = (2, 36)


@pytest.mark.parametrize(
    "text, policy",
    [
        ("always [madvise] never\n", "madvise"),
        ("[always] madvise never\n", "always"),
        ("always madvise [never]\n", "never"),
        ("", None),
    ],
)
def test_the_kernels_policy_is_the_bracketed_word(tmp_path: Path, text: str, policy: str) -> None:
    path = tmp_path / "enabled"
    path.write_text(text)
    assert launch.thp_policy(path) == policy


def test_no_policy_file_is_no_policy(tmp_path: Path) -> None:
    assert launch.thp_policy(tmp_path / "missing") is None


def test_a_madvise_kernel_restarts_with_the_tunable_and_keeps_the_callers() -> None:
    fresh = launch.with_huge_pages({"PATH": "/bin"}, "madvise", GLIBC)
    assert fresh == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    theirs = launch.with_huge_pages(
        {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise", GLIBC
    )
    assert theirs == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}


@pytest.mark.parametrize(
    "environ, policy, glibc",
    [
        ({}, "always", GLIBC),  # every anonymous mapping gets huge pages already
        ({}, "never", GLIBC),  # advice is ignored
        ({}, None, GLIBC),  # no such kernel setting (another OS, a container hiding /sys)
        ({}, "madvise", (2, 34)),  # a glibc without the tunable
        ({}, "madvise", None),  # another C library (musl)
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", GLIBC),  # the caller's choice
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, "madvise", GLIBC),  # restarted already
    ],
)
def test_no_restart_where_it_would_change_nothing(
    environ: dict[str, str], policy: str | None, glibc: tuple[int, ...] | None
) -> None:
    assert launch.with_huge_pages(environ, policy, glibc) is None


CHILD = """
import ctypes, os, sys
from flows import launch
if "glibc.malloc.hugetlb" not in os.environ.get("GLIBC_TUNABLES", ""):
    print("first", os.getpid(), flush=True)
    launch.restart_with_huge_pages("madvise")  # as `far` does where the kernel says madvise
    print("not restarted", flush=True)
    sys.exit(1)
libc = ctypes.CDLL(None)  # glibc's malloc, which XLA's host buffers come from
libc.malloc.restype = ctypes.c_void_p
size = 160 << 20  # a vocabulary table's size class
table = libc.malloc(ctypes.c_size_t(size))
ctypes.memset(table, 1, size)  # touched, so its pages exist
rollup = open("/proc/self/smaps_rollup").read()
huge = int(rollup.split("AnonHugePages:")[1].split()[0])
print("restarted", os.getpid(), os.environ["GLIBC_TUNABLES"], huge, flush=True)
"""


def test_the_restart_is_the_same_process_with_its_arrays_on_huge_pages() -> None:
    policy = launch.thp_policy()
    if policy != "madvise" or not Path("/proc/self/smaps_rollup").exists():
        pytest.skip(f"the restart is for a madvise-only kernel; this one's policy is {policy}")
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    first, restarted = done.stdout.split("\n")[:2]
    assert first.split()[1] == restarted.split()[1]  # the same pid: a lease holder stays one
    assert restarted.split()[2] == "glibc.malloc.hugetlb=1"
    assert int(restarted.split()[3]) >= 100 * 1024  # KiB of the 160 MiB table on huge pages
    # the defect it answers: the same array without the tunable is on 4 KiB pages
    env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=0"
    plain = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert int(plain.stdout.split()[3]) < 16 * 1024, plain.stdout
