"""FAR's stages and the shared layers they stand on.

The stages, one entry point each, `run(inputs, config, ctx)`, declared once in registry.py:
data_prep/, sft.py, grpo/, evaluate/, hard_subset.py, self_teach.py, preferences.py, dpo.py,
distill.py; export.py is `far export`, no pipeline node. A stage imports only the shared
layers (core/, modeling/, rewards/) and schemas/, never another stage: what one stage hands
the next is a contract (schemas/artifacts.py) pointing at files on storage. Nothing here
imports Prefect: every stage runs the same from a test, a notebook or a flow.
pyproject.toml's [tool.importlinter] contracts enforce both rules.
"""
