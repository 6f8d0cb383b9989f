"""stages/modeling/torchless_tensorboard.py: Tunix imports without torch once `stages` is
imported, TensorBoard still writes, and torch stays importable.

Each case runs in a fresh interpreter (a real import, nothing faked): what a module imports
can only be seen in a process that has not imported it yet.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stages.modeling import torchless_tensorboard
from tests.tensorboard_events import scalar_tags

REPO = Path(__file__).resolve().parents[2]

# What a stage process does: import FAR's stages, then Tunix (whose metrics logger imports
# tensorboardX), write a scalar the way metrax's backend does, then import torch itself.
STAGE_PROCESS = """
import json, sys
import stages
from tunix.sft import metrics_logger
from tensorboardX import SummaryWriter
after_tunix = "torch" in sys.modules
writer = SummaryWriter(sys.argv[1])
writer.add_scalar("far/loss", 1.5, 1)
writer.close()
import torch
print(json.dumps({"after_tunix": after_tunix, "torch": torch.__name__,
                  "hooks": sum(type(f).__name__ == "_WriterFinder" for f in sys.meta_path)}))
"""


def python(code: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_tensorboardx_alone_imports_torch() -> None:
    """The defect: tensorboardX 2.6.5's writer imports torch whenever it is installed."""
    assert python("import sys, tensorboardX; print('torch' in sys.modules)") == "True"


def test_a_stage_process_imports_tunix_without_torch_and_still_writes_tensorboard(
    tmp_path: Path,
) -> None:
    stages_import = str(REPO / "stages" / "__init__.py")
    assert "torchless_tensorboard.install()" in Path(stages_import).read_text()
    seen = json.loads(python(STAGE_PROCESS, str(tmp_path)))
    assert seen == {"after_tunix": False, "torch": "torch", "hooks": 1}
    assert scalar_tags(tmp_path) == {"far/loss"}


def test_an_untested_tensorboardx_is_imported_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another tensorboardX version may need torch at import: the finder then stands aside."""
    import tensorboardX

    finder, path = torchless_tensorboard._WriterFinder(), tensorboardX.__path__
    assert finder.find_spec(torchless_tensorboard.WRITER, path) is not None
    assert finder.find_spec("tensorboardX.summary", path) is None  # only the writer
    monkeypatch.setattr(torchless_tensorboard, "TESTED_TENSORBOARDX", ("0.0",))
    assert finder.find_spec(torchless_tensorboard.WRITER, path) is None
