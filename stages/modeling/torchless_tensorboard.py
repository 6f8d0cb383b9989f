"""Import tensorboardX without torch: 2.5 CPU-s less for every process that imports Tunix.

Tunix imports its metrics logger, which imports metrax's TensorBoard backend, which imports
tensorboardX; tensorboardX 2.6.5's writer then runs `try: import torch` at module level only to
name a type in its annotations (`numpy_compatible`). torch is installed beside FAR (the tests
compare exports with transformers), so every `far run`, stage child and test process paid for
importing torch: 2.5 of the 5.4 CPU-s of `import tunix` on the 2-core machine
(`python -X importtime -c "import tunix"`), though FAR never hands tensorboardX a torch tensor
(it writes scalars).

`install()` puts a finder on sys.meta_path that, for the tested tensorboardX only, runs the
writer module's code with torch hidden (sys.modules["torch"] = None makes `import torch` raise
ImportError), which gives the writer an install without torch would give it, then restores
sys.modules: torch stays importable for whoever wants it later. It acts on that one module,
once, and never when torch is already imported (nothing to save then). stages/__init__.py
installs it, so it is in place before any stage imports Tunix.
Test: tests/unit/test_torchless_tensorboard.py (tensorboardX alone imports torch; after
`import stages`, Tunix imports without torch and TensorBoard still writes its scalars).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from importlib import metadata
from types import ModuleType

WRITER = "tensorboardX.writer"
TESTED_TENSORBOARDX = ("2.6.5",)  # the writer's only module-level torch use is the type name


class _TorchHiddenLoader(importlib.abc.Loader):
    """Runs a module's code with `import torch` failing, then makes torch importable again."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        if "torch" in sys.modules:  # imported already: hiding it would save nothing
            self._loader.exec_module(module)
            return
        sys.modules["torch"] = None  # type: ignore[assignment]  # the documented way to block an import
        try:
            self._loader.exec_module(module)
        finally:
            if sys.modules.get("torch", ...) is None:
                del sys.modules["torch"]


class _WriterFinder(importlib.abc.MetaPathFinder):
    """Finds tensorboardX's writer as the path finder does, with the torch-hiding loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != WRITER or not _tested_version():
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _TorchHiddenLoader(spec.loader)
        return spec


def _tested_version() -> bool:
    try:
        return metadata.version("tensorboardX") in TESTED_TENSORBOARDX
    except metadata.PackageNotFoundError:
        return False


def install() -> None:
    """Put the finder first on sys.meta_path (once per process; a no-op after that)."""
    if not any(isinstance(finder, _WriterFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WriterFinder())
