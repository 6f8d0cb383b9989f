"""FAR's stages and the shared layers they stand on.

The stages, one entry point each, `run(inputs, config, ctx)`, declared once in registry.py:
data_prep/, sft.py, grpo/, evaluate/, hard_subset.py, self_teach.py, preferences.py, dpo.py,
distill.py. The shared layers, declared in registry.py's SHARED_LAYERS: core/, modeling/ (with
hf_export.py, `far export`), rewards/; nothing else sits here (tests/unit/test_registry.py).
A stage imports only the shared layers and schemas/, never another stage: what one stage hands
the next is a contract (schemas/artifacts.py) pointing at files on storage. Nothing here
imports Prefect: every stage runs the same from a test, a notebook or a flow.
pyproject.toml's [tool.importlinter] contracts enforce both rules.

Importing this package installs one import hook (stages/modeling/torchless_tensorboard.py):
Tunix's TensorBoard writer is imported without torch, 2.5 CPU-s less for every process.
"""

from stages.modeling import torchless_tensorboard

torchless_tensorboard.install()
