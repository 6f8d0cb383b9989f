"""The recipe's `logging:` section: FAR's trainers start only the metrics backends it names.

Tunix 0.1.7, given no backends, starts TensorBoard and also an anonymous W&B run whenever
`wandb` is importable. `wandb` is not installed here (and must not be), so these tests put a
stand-in `wandb` package on sys.path that records each `init` call in a file: it stands in
for a package that cannot be installed, nothing else is faked. MLflow is real (a SQLite store
under the run, read back with MLflow's own client); Tunix's MetricsLogger is real.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flax import nnx
from mlflow.tracking import MlflowClient
from tunix.sft import metrics_logger

from pipeline.plan import plan_recipe
from pipeline.recipes import RecipeError
from schemas.recipe import LoggingConfig
from stages import sft
from stages.core import metrics_logging
from stages.core.errors import InputError
from stages.grpo import training as grpo
from stages.modeling import models, tunix_compat
from tests.conftest import recipe_with

FAKE_WANDB = '''"""A stand-in for the wandb package (not installable here): records init calls."""
import json

RECORD = {record!r}
run = None


class _Run:
    url = "https://wandb.invalid/run"

    def log(self, data, step=None):
        with open(RECORD, "a") as f:
            f.write(json.dumps({{"log": data, "step": step}}) + "\\n")

    def finish(self):
        pass


def init(**kwargs):
    global run
    with open(RECORD, "a") as f:
        f.write(json.dumps({{"init": kwargs}}) + "\\n")
    run = _Run()
    return run


def finish():
    pass
'''


@pytest.fixture
def wandb_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An importable stand-in `wandb` (gone again afterwards); yields the file its calls are
    written to."""
    record = tmp_path / "wandb-calls.jsonl"
    package = tmp_path / "site" / "wandb"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_WANDB.format(record=str(record)))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield record
    sys.modules.pop("wandb", None)


def inits(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    lines = [json.loads(x) for x in record.read_text().splitlines()]
    return [x["init"] for x in lines if "init" in x]


def sinks(tmp_path: Path, **logging: Any) -> metrics_logging.MetricsSinks:
    config = LoggingConfig(**logging)
    run_uri = str(tmp_path / "runs" / "r")
    return metrics_logging.for_stage(config, "r", run_uri, f"{run_uri}/grpo-0123456789ab")


def grpo_logger(tmp_path: Path, stage_sinks: Any = None) -> metrics_logger.MetricsLogger:
    """The MetricsLogger Tunix's RLCluster builds from the GRPO stage's cluster config."""
    recipe = recipe_with(str(tmp_path))
    mesh = models.build_mesh(recipe.mesh)
    extra = () if stage_sinks is None else (stage_sinks,)
    config = grpo._cluster_config(
        recipe.grpo, 16, str(tmp_path / "ck"), str(tmp_path / "tb"), (mesh, mesh), [1], *extra
    )
    return metrics_logger.MetricsLogger(config.training_config.metrics_logging_options)


def sft_trainer(tmp_path: Path, stage_sinks: Any = None) -> Any:
    """SFT's own build_trainer (a one-layer network stands in for the model: only the
    trainer's metrics logger is looked at)."""
    recipe = recipe_with(str(tmp_path), sft={"lora": None})
    network = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    extra = () if stage_sinks is None else (stage_sinks,)
    args = (network, recipe.sft, str(tmp_path / "ck"), str(tmp_path / "tb"), 8, *extra)
    return sft.build_trainer(*args)


def close(logger: Any) -> None:
    """Close a MetricsLogger and detach its backends from jax.monitoring (JAX 0.10.2 keeps
    them after close, and they would hear the next test's scalars)."""
    logger.close()
    tunix_compat.release_scalar_listeners(logger)


def test_the_stand_in_is_what_tunix_would_start(tmp_path: Path, wandb_calls: Path) -> None:
    """Tunix left to itself starts a W&B run when `wandb` imports: the defect FAR avoids."""
    logger = metrics_logger.MetricsLogger(metrics_logger.MetricsLoggerOptions(str(tmp_path)))
    close(logger)
    assert [call["project"] for call in inits(wandb_calls)] == ["tunix"]


def test_sft_and_grpo_start_no_wandb_run_unless_asked(tmp_path: Path, wandb_calls: Path) -> None:
    trainer = sft_trainer(tmp_path / "sft")
    trainer.close()
    tunix_compat.release_scalar_listeners(trainer.metrics_logger)
    close(grpo_logger(tmp_path / "grpo"))
    close(grpo_logger(tmp_path / "grpo2", sinks(tmp_path, tensorboard=True)))
    assert inits(wandb_calls) == []
    assert list((tmp_path / "sft" / "tb").glob("events.out.tfevents*"))  # TensorBoard still on


def test_wandb_on_starts_one_named_run_per_stage(tmp_path: Path, wandb_calls: Path) -> None:
    logger = grpo_logger(tmp_path, sinks(tmp_path, wandb=True, experiment="gsm8k"))
    logger.log("", "loss", 0.5, "train", step=3)
    close(logger)
    (call,) = inits(wandb_calls)
    assert call == {
        "project": "gsm8k",
        "name": "grpo",
        "id": "grpo-0123456789ab",
        "resume": "allow",
    }
    logged = [json.loads(x) for x in wandb_calls.read_text().splitlines()]
    assert {"log": {"train/loss": 0.5}, "step": 3} in logged


def test_every_backend_off_starts_none(tmp_path: Path, wandb_calls: Path) -> None:
    """An empty backend list would make Tunix fall back to its defaults (W&B included)."""
    off = sinks(tmp_path, tensorboard=False)
    assert off.factories(str(tmp_path / "tb")) == [metrics_logging.Silent]
    logger = grpo_logger(tmp_path, off)
    logger.log("", "loss", 0.5, "train", step=1)
    close(logger)
    assert inits(wandb_calls) == []
    assert not list((tmp_path / "tb").glob("**/events.out.tfevents*"))


def test_grpo_metrics_land_in_mlflow_and_a_continued_stage_adds_to_its_run(
    tmp_path: Path,
) -> None:
    stage = sinks(tmp_path, mlflow=True, tensorboard=False)
    db = tmp_path / "runs" / "r" / "mlflow" / "mlflow.db"
    assert stage.tracking_uri == f"sqlite:///{db}"
    first = grpo_logger(tmp_path / "s1", stage)
    for step, (reward, loss) in enumerate([(0.25, 2.0), (0.5, 1.5)], start=1):
        first.log("rewards", "sum", reward, "train", step=step)
        first.log("actor", "loss", loss, "train", step=step)
    close(first)
    second = grpo_logger(tmp_path / "s2", stage)  # the next session of the same stage
    second.log("rewards", "sum", 0.75, "train", step=3)
    close(second)
    stage.log_once(str(tmp_path / "tb"), 3, {"far/tokens_per_second": 12.5})

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("r")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "grpo" and run.info.status == "FINISHED"
    assert run.data.tags[metrics_logging.STAGE_TAG] == "grpo-0123456789ab"

    def history(key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]

    assert history("rewards/train/sum") == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert history("actor/train/loss") == [(1, 2.0), (2, 1.5)]
    assert history("far/tokens_per_second") == [(3, 12.5)]


def test_a_plain_tracking_path_is_a_sqlite_file(tmp_path: Path) -> None:
    config = LoggingConfig(mlflow=True, mlflow_tracking_uri=str(tmp_path / "t" / "m.db"))
    uri = metrics_logging.tracking_uri(config, "gs://bucket/runs/r")
    assert uri == f"sqlite:///{tmp_path / 't' / 'm.db'}"
    server = LoggingConfig(mlflow=True, mlflow_tracking_uri="http://127.0.0.1:5000")
    assert metrics_logging.tracking_uri(server, "gs://b/r") == "http://127.0.0.1:5000"


def test_an_unwritable_mlflow_store_is_an_input_error(tmp_path: Path) -> None:
    """MLflow 3 refuses its old directory store: said as the recipe field to fix."""
    uri = f"file://{tmp_path}/mlruns"
    config = LoggingConfig(tensorboard=False, mlflow=True, mlflow_tracking_uri=uri)
    stage = metrics_logging.for_stage(config, "r", str(tmp_path / "r"), str(tmp_path / "r/sft-1"))
    (factory,) = stage.factories(str(tmp_path / "tb"))
    with pytest.raises(InputError, match=r"logging\.mlflow_tracking_uri"):
        factory()


def test_wandb_on_without_the_package_is_refused_before_compute(tmp_path: Path) -> None:
    recipe = recipe_with(str(tmp_path), logging={"wandb": True}, sandbox={"isolation": "process"})
    with pytest.raises(InputError, match=r"logging\.wandb is true but the 'wandb' package"):
        plan_recipe(recipe)
    assert not (tmp_path / recipe.name).exists()


def test_wandb_on_with_the_package_plans(tmp_path: Path, wandb_calls: Path) -> None:
    recipe = recipe_with(str(tmp_path), logging={"wandb": True}, sandbox={"isolation": "process"})
    assert plan_recipe(recipe).recipe.logging.wandb
    assert inits(wandb_calls) == []  # planning starts nothing


@pytest.mark.parametrize(
    ("root", "logging", "says"),
    [
        ("gs://bucket/far", {"mlflow": True}, "set logging.mlflow_tracking_uri"),
        ("memory://far", {"mlflow": True}, "needs a local storage_root"),
        ("/tmp/far", {"mlflow_tracking_uri": "sqlite:////tmp/m.db"}, "logging.mlflow is false"),
        ("/tmp/far", {"experiment": ""}, "experiment"),
        ("/tmp/far", {"tensorbord": True}, "tensorbord"),
    ],
)
def test_logging_section_mistakes_fail_validation(
    root: str, logging: dict[str, Any], says: str
) -> None:
    with pytest.raises(RecipeError, match=says):
        recipe_with(root, logging=logging)


def test_a_remote_root_with_its_own_tracking_uri_validates() -> None:
    recipe = recipe_with("gs://bucket/far", logging={"mlflow": True, "mlflow_tracking_uri": "x.db"})
    assert recipe.logging.mlflow_tracking_uri == "x.db"
