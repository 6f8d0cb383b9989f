"""`far export --push-to REPO`: the export directory as a commit to a Hugging Face hub repo.

huggingface_hub's HfApi does the work (create_repo, then upload_folder in one commit) against
the endpoint given (--hub-endpoint, else HF_ENDPOINT, else huggingface.co). The token and the
endpoint are checked with one whoami call before any model is built, so a missing token or an
unreachable hub is a one-line error naming the flag, not a failure after the export.
"""

from __future__ import annotations

import logging

import httpx
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

from stages.core.errors import InputError

log = logging.getLogger(__name__)


def hub_api(repo_id: str, endpoint: str | None) -> HfApi:
    """An HfApi for `endpoint` whose token the hub accepts; InputError otherwise."""
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise InputError(f"--push-to {repo_id!r}: expected a hub repository id NAMESPACE/NAME")
    api = HfApi(endpoint=endpoint)
    where = api.endpoint
    try:
        api.whoami()
    except LocalTokenNotFoundError as e:
        raise InputError(
            f"--push-to {repo_id}: no Hugging Face token; set HF_TOKEN or run `hf auth login`"
        ) from e
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        raise InputError(
            f"--push-to {repo_id}: the hub at {where} refused the token (HTTP {status}); "
            f"set HF_TOKEN to a token with write access"
        ) from e
    except (OSError, httpx.TransportError) as e:  # connection refused, DNS, timeouts
        raise InputError(
            f"--hub-endpoint {where}: cannot reach the hub ({type(e).__name__}); give a "
            f"reachable endpoint (--hub-endpoint or HF_ENDPOINT)"
        ) from e
    return api


def push(api: HfApi, repo_id: str, local_dir: str, message: str) -> str:
    """Create `repo_id` if needed and commit `local_dir` to it; returns the commit's URL."""
    api.create_repo(repo_id, repo_type="model", exist_ok=True)
    commit = api.upload_folder(repo_id=repo_id, folder_path=local_dir, commit_message=message)
    log.info("pushed %s to %s/%s", local_dir, api.endpoint, repo_id)
    return str(commit.commit_url)
