"""`far` with its SFT stages paced (test-only): a sleep before every SFT batch, so that a
signal a test sends once SFT has saved a checkpoint lands mid-training with a few dozen steps
of compute instead of hundreds. Everything else is `far` itself (flows.cli.main, in this
process: its signal handlers, its Prefect server, its exit codes).

usage: python -m tests.integration._paced_far_child SECONDS FAR_ARGS...
"""

from __future__ import annotations

import sys

from flows import cli
from tests.integration._sft_child import pace_sft

if __name__ == "__main__":
    pace_sft(float(sys.argv[1]))
    sys.exit(cli.main(sys.argv[2:]))
