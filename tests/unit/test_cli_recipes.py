"""`far recipes` lists and copies the bundled recipes, and a mistyped recipe field or stage
kind names the nearest valid one (a did-you-mean). Real CLI calls (in process), real files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from flows import cli
from pipeline.recipes import load_recipe
from tests.conftest import REPO, SMOKE


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    """`far` sets Prefect's defaults in os.environ (setdefault); keep them out of other tests."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def far(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_recipes_lists_every_bundled_recipe_with_its_first_comment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = far(capsys, "recipes")
    assert code == 0
    listed = {line.split()[0] for line in out.splitlines()[:-2]}
    assert listed == {p.stem for p in (REPO / "recipes").glob("*.yaml")}
    smoke = next(line for line in out.splitlines() if line.startswith("smoke "))
    first = SMOKE.read_text().splitlines()[0].removeprefix("# smoke:").strip()
    assert smoke.split(None, 1)[1] == first


def test_recipes_copy_writes_a_runnable_copy_and_never_overwrites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = far(capsys, "recipes", "copy", "smoke", str(tmp_path))
    copied = tmp_path / "smoke.yaml"
    assert code == 0 and str(copied) in out
    assert copied.read_text() == SMOKE.read_text()
    assert load_recipe(str(copied)).name == "smoke"
    copied.write_text("# my edits\n" + SMOKE.read_text())
    code, out, err = far(capsys, "recipes", "copy", "smoke", str(copied))
    assert code == cli.EXIT_INVALID and out == ""
    assert err.startswith(f"far: {copied} exists") and len(err.splitlines()) == 1
    assert copied.read_text().startswith("# my edits")  # untouched


def test_recipes_copy_of_a_mistyped_name_suggests_the_nearest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = far(capsys, "recipes", "copy", "smok", str(tmp_path / "x.yaml"))
    assert code == cli.EXIT_INVALID and out == ""
    assert "no bundled recipe 'smok'; did you mean smoke?" in err
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "sft.max_step=3",
            "sft.max_step: Extra inputs are not permitted (got 3); did you mean max_steps?",
        ),
        ("model.familly=x", "did you mean family?"),
        ("grpo.rewardz={}", "did you mean rewards?"),
        (
            "pipeline=[{id: a, kind: data_prep}, {id: s, kind: sft, inputs: {dataset: a}, "
            "config: {max_steps: 1, batch_size: 1, learnin_rate: 0.1}}]",
            "pipeline.1.sft.config.learnin_rate: Extra inputs are not permitted (got 0.1); "
            "did you mean learning_rate?",
        ),
        ("pipeline=[{id: a, kind: data_prepp}]", "did you mean 'data_prep'?"),
    ],
)
def test_a_mistyped_field_or_kind_names_the_nearest(
    override: str, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = far(capsys, "validate", str(SMOKE), override)
    assert code == cli.EXIT_INVALID and out == ""
    assert line in err, err


def test_nothing_close_suggests_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = yaml.safe_load(SMOKE.read_text()) | {"zzzq": 1}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    code, _, err = far(capsys, "validate", str(tmp_path / "r.yaml"))
    assert code == cli.EXIT_INVALID and "zzzq: Extra inputs are not permitted (got 1)\n" in err
    assert "did you mean" not in err
