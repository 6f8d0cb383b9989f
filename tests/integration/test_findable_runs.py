"""Flow runs you can find among others: each session's flow run is named `{run}-s{session}` and
tagged with the recipe, its stage kinds and the code's git commit; read back from a real
Prefect API (the in-process test server) after two real sessions of a one-stage run."""

from __future__ import annotations

import re
from pathlib import Path

from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

from flows.far_flow import format_align_reinforce, session_name
from stages.core import storage
from tests.conftest import recipe_with


def test_sessions_are_named_and_tagged(prefect_server: None, tmp_path: Path) -> None:
    root = storage.normalize(str(tmp_path))
    recipe = recipe_with(root, name="findable", pipeline=[{"id": "data_prep", "kind": "data_prep"}])
    for _ in range(2):  # the second session skips data_prep: still a session of its own
        format_align_reinforce(recipe, root, recipe_source="recipes/smoke.yaml")
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=["recipe:smoke"]))
        )
    ours = sorted((r for r in runs if r.name.startswith("findable")), key=lambda r: r.name)
    assert [r.name for r in ours] == ["findable-s1", "findable-s2"]
    for run in ours:
        assert "kind:data_prep" in run.tags
        assert [t for t in run.tags if re.fullmatch(r"commit:[0-9a-f]{12}", t)], run.tags


def test_a_session_name_counts_the_sessions_run_json_lists(tmp_path: Path) -> None:
    run_uri = storage.normalize(str(tmp_path / "smoke"))
    assert session_name("smoke", run_uri) == "smoke-s1"  # no run yet
    assert session_name("smoke", run_uri, sessions=3) == "smoke-s3"
    (tmp_path / "smoke").mkdir()
    (tmp_path / "smoke" / "run.json").write_text("{not json")
    assert session_name("smoke", run_uri) == "smoke"  # refused later, with the reason
