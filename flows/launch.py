"""The `far` executable: the process settings that must exist before Python starts, then
`flows.cli.main`.

glibc reads its tunables once, when a process starts. On a kernel whose transparent huge pages
are `madvise`-only (many cloud VMs), glibc's malloc asks for none, so the arrays XLA allocates
on the host (Gemma 3's 671 MB vocabulary table among them) sit on 4 KiB pages, and a decode step
that streams every weight spends its time on address translation (docs/performance.md: "Huge
pages"). `glibc.malloc.hugetlb=1` makes malloc advise huge pages for what it maps, which changes
no result: the same bytes, on larger pages. So `far` restarts itself once with that tunable
added, before importing anything heavy, and leaves the process alone where it would change
nothing: another page policy, a glibc without the tunable, or a tunable already set.

Only this module may import nothing of FAR's: it runs before the command line exists.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

TUNABLES = "GLIBC_TUNABLES"
HUGE_PAGES = "glibc.malloc.hugetlb=1"
THP_POLICY = Path("/sys/kernel/mm/transparent_hugepage/enabled")
FIRST_GLIBC = (2, 35)  # the first glibc with glibc.malloc.hugetlb


def thp_policy(path: Path = THP_POLICY) -> str | None:
    """The kernel's transparent-huge-page policy (always, madvise, never); None if unknown."""
    try:
        text = path.read_text()
    except OSError:
        return None
    chosen = [word[1:-1] for word in text.split() if word.startswith("[")]
    return chosen[0] if chosen else None


def glibc_version() -> tuple[int, ...] | None:
    """This process's glibc version, None on another C library."""
    name, version = platform.libc_ver()
    if name != "glibc" or not version:
        return None
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return None


def with_huge_pages(
    environ: Mapping[str, str], policy: str | None, glibc: tuple[int, ...] | None
) -> dict[str, str] | None:
    """The environment to restart with, or None where the tunable would change nothing:
    a policy other than madvise, a glibc without it, or `glibc.malloc.hugetlb` already set
    (the user's choice, and what stops a second restart)."""
    if policy != "madvise" or glibc is None or glibc < FIRST_GLIBC:
        return None
    current = environ.get(TUNABLES, "")
    if "glibc.malloc.hugetlb" in current:
        return None
    return {**environ, TUNABLES: f"{current}:{HUGE_PAGES}" if current else HUGE_PAGES}


def restart_with_huge_pages(policy: str | None) -> None:
    """Replace this process (the same pid, interpreter and arguments) with one whose glibc
    advises huge pages, where `with_huge_pages` says that changes something; else return."""
    restart = with_huge_pages(os.environ, policy, glibc_version())
    if restart is not None:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], restart)


def main() -> int:
    """`far`: restart once with huge pages where they are advised only, then the CLI."""
    restart_with_huge_pages(thp_policy())
    from flows.cli import main as cli_main

    return cli_main()
