"""An MLflow tracking URI that cannot be used is refused by `far validate` and `far run` before
any compute, in seconds, with one line naming logging.mlflow_tracking_uri: a server that
accepts connections and never answers (a real socket on loopback), and a path under a file
where MLflow needs a directory. A stage's MLflow client gets bounded retries and timeouts."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from flows import cli
from schemas.recipe import LoggingConfig
from stages.core import metrics_logging
from stages.core.metrics_logging import UnusableTrackingUri, check_tracking_uri
from tests.conftest import SMOKE
from tests.silent_server import silent_server


def _validate(tmp_path: Path, uri: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    argv = ["validate", str(SMOKE), "--root", str(tmp_path / "runs")]
    argv += ["logging.mlflow=true", f"logging.mlflow_tracking_uri={uri}"]
    code = cli.main(argv)
    return code, capsys.readouterr().err


def test_a_server_that_never_answers_is_refused_in_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with silent_server() as port:
        uri = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        code, err = _validate(tmp_path, uri, capsys)
        took = time.monotonic() - started
    assert code == 2, err
    assert f"far: logging.mlflow_tracking_uri: the MLflow server {uri} did not answer" in err
    assert "within 5 s (ReadTimeout)" in err
    assert "Traceback" not in err
    assert took < metrics_logging.TRACKING_CHECK_SECONDS + 20


def test_far_run_refuses_it_before_compute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with silent_server() as port:
        uri = f"http://127.0.0.1:{port}"
        argv = ["run", str(SMOKE), "--root", str(tmp_path / "runs")]
        code = cli.main([*argv, "logging.mlflow=true", f"logging.mlflow_tracking_uri={uri}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "logging.mlflow_tracking_uri: the MLflow server" in err
    assert not list((tmp_path / "runs").glob("*/sft-*"))


@pytest.mark.parametrize("form", ["plain", "sqlite", "file"])
def test_a_path_under_a_file_is_refused(
    tmp_path: Path, form: str, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where MLflow needs a directory")
    path = blocker / "mlflow" / "m.db"
    uri = {"plain": str(path), "sqlite": f"sqlite:///{path}", "file": f"file://{path.parent}"}[form]
    code, err = _validate(tmp_path, uri, capsys)
    assert code == 2, err
    assert (
        f"far: logging.mlflow_tracking_uri: MLflow cannot write {uri!r}: {blocker} is a file, "
        f"not a directory" in err
    )
    assert not (tmp_path / "runs").exists()  # validate writes nothing


def test_writable_paths_and_answering_servers_pass(tmp_path: Path) -> None:
    for uri in [str(tmp_path / "new" / "m.db"), f"sqlite:///{tmp_path}/m.db", "databricks"]:
        check_tracking_uri(LoggingConfig(mlflow=True, mlflow_tracking_uri=uri))
    assert not (tmp_path / "new").exists()
    check_tracking_uri(LoggingConfig(mlflow=False))
    check_tracking_uri(LoggingConfig(mlflow=True))  # the run's own store: storage_root's check


def test_a_closed_port_is_refused_too() -> None:
    with silent_server() as port:
        pass  # closed again: connections are refused
    with pytest.raises(UnusableTrackingUri, match="ConnectError"):
        check_tracking_uri(
            LoggingConfig(mlflow=True, mlflow_tracking_uri=f"http://127.0.0.1:{port}")
        )


def test_a_stage_client_gets_bounded_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in metrics_logging.CLIENT_BOUNDS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "7")  # the user's own setting is kept
    backend = metrics_logging.MLflow(
        f"sqlite:///{tmp_path}/m.db", "e", "sft", {metrics_logging.STAGE_TAG: "sft-0"}
    )
    backend.close()
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "7"
