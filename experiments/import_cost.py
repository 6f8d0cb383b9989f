"""CPU seconds a process spends importing what a stage process imports, with and without
stages/modeling/torchless_tensorboard.py's hook (tensorboardX's writer without torch).

Each import runs in a fresh interpreter, alternating, `--reps` pairs; the CPU seconds are
the child's user + system time (os.wait4), so other load on the machine changes them little.

    .venv/bin/python -m experiments.import_cost --reps 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Tunix as every stage imports it, without the hook (stages is not imported), and with it
CASES = {
    "tunix alone": "import tunix.sft.peft_trainer",
    "stages first": "import stages; import tunix.sft.peft_trainer",
}


def cpu_seconds(code: str) -> float:
    """User + system CPU seconds of a fresh interpreter that runs `code`."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env)
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{code!r} failed with status {status}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="pairs of fresh interpreters")
    args = parser.parse_args()
    seconds: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.reps):
        for name, code in CASES.items():
            seconds[name].append(cpu_seconds(code))
    for name, values in seconds.items():
        print(f"{name:>13}: median {statistics.median(values):.2f} CPU-s  {values}")
    ratio = statistics.median(seconds["stages first"]) / statistics.median(seconds["tunix alone"])
    print(f"stages first / tunix alone: {ratio:.2f}")


if __name__ == "__main__":
    main()
