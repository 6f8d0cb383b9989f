"""Runs `far run` (flows.cli.main) once per recipe in one process, as the test's child.

argv: a JSON file {case: recipe path} and the result file. Each case's stderr is taken at the
file-descriptor level (what a user's terminal would show, Prefect's console handler
included) into its own file; the result maps case -> {"code": exit status, "stderr": text}.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from flows import cli


def run_case(recipe: str, extra: list[str]) -> tuple[int, str]:
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile("w+") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            code = cli.main(["run", recipe, *extra])
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        return code, captured.read()


def main() -> None:
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    results = {}
    for name, (recipe, extra) in cases.items():
        code, err = run_case(recipe, extra)
        results[name] = {"code": code, "stderr": err}
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
