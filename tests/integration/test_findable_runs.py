"""Runs you can find on a shared Prefect server: each session's flow run is named
`{run}-{id}-s{session}` (the id a short hash of the run's URI) and tagged `far`, the recipe,
the storage root, the user, the recipe's hash, its stage kinds and the code's git commit;
artifact keys carry the same id. Read back from a real Prefect API (the in-process test
server) after real sessions of one recipe under two storage roots; `far runs` lists them."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from prefect import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterName,
    FlowRunFilterTags,
)

from flows.far_flow import format_align_reinforce, recipe_hash, session_name
from flows.ui_artifacts import run_id
from stages.core import storage
from tests.conftest import BIN, recipe_with


def test_runs_under_two_roots_have_their_own_names_tags_and_artifacts(
    prefect_server: None, tmp_path: Path
) -> None:
    roots = [storage.normalize(str(tmp_path / who)) for who in ("alice", "bob")]
    summaries, hashes = {}, set()
    for root in roots:
        recipe = recipe_with(
            root, name="findable", pipeline=[{"id": "data_prep", "kind": "data_prep"}]
        )
        hashes.add(recipe_hash(recipe))
        for _ in range(2 if root == roots[0] else 1):  # alice's second session skips data_prep
            summaries[root] = format_align_reinforce(
                recipe, root, recipe_source="recipes/smoke.yaml"
            )
    # filtered on the server: the session's server holds every test's runs and artifacts, and
    # an unfiltered read returns only the API's default page of them (200, in id order)
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=["far", "recipe:smoke"]),
                name=FlowRunFilterName(like_="findable-"),
            )
        )
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_="far-findable-%"))
        )
    (one_hash,) = hashes  # the same recipe under two roots: one hash
    ours = [r for r in runs if r.name.startswith("findable-")]
    ids = [run_id(storage.join(root, "findable")) for root in roots]
    assert ids[0] != ids[1]
    assert sorted(r.name for r in ours) == sorted(
        [f"findable-{ids[0]}-s1", f"findable-{ids[0]}-s2", f"findable-{ids[1]}-s1"]
    )
    for run in ours:
        root = roots[0] if ids[0] in run.name else roots[1]
        assert {"far", "recipe:smoke", "kind:data_prep", f"root:{root}"} <= set(run.tags)
        assert f"recipe-hash:{one_hash[:12]}" in run.tags
        assert [t for t in run.tags if re.fullmatch(r"user:\S+", t)], run.tags
        assert [t for t in run.tags if re.fullmatch(r"commit:[0-9a-f]{12}", t)], run.tags
    ledger_keys = {a.key for a in artifacts if a.key and a.key.startswith("far-findable-")}
    assert {f"far-findable-{i}-run-ledger" for i in ids} <= ledger_keys
    assert not any(k.startswith("far-findable-run-") for k in ledger_keys)  # no shared key

    listed = subprocess.run(
        [str(BIN / "far"), "runs", str(tmp_path / "alice"), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    (listing,) = json.loads(listed.stdout)["runs"]
    assert listing["run"] == "findable" and listing["state"] == "complete"
    assert listing["sessions"] == 2
    assert listing["ledger_root"] == summaries[roots[0]].ledger_root


def test_a_session_name_counts_the_sessions_run_json_lists(tmp_path: Path) -> None:
    run_uri = storage.normalize(str(tmp_path / "smoke"))
    label = f"smoke-{run_id(run_uri)}"
    assert session_name("smoke", run_uri) == f"{label}-s1"  # no run yet
    assert session_name("smoke", run_uri, sessions=3) == f"{label}-s3"
    (tmp_path / "smoke").mkdir()
    (tmp_path / "smoke" / "run.json").write_text("{not json")
    assert session_name("smoke", run_uri) == label  # refused later, with the reason
