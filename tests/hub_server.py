"""A minimal Hugging Face hub for tests: the HTTP endpoints huggingface_hub's HfApi calls for
whoami, create_repo and upload_folder (with the hub's check of README.md's front matter),
storing each repository's files in a directory.

No hub server installs here from the registries (hf-local-hub on PyPI is a client only), so
this one is written for the tests: real HTTP on a real port, spoken to by the real
huggingface_hub client; nothing of FAR is replaced. It accepts one token (TOKEN) and answers
401 to any other, and asks for every file as a "regular" upload (base64 in the commit), the
upload mode the hub uses for small files.

Run as `python -m tests.hub_server ROOT PORT`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

TOKEN = "hf_test_token_for_the_local_hub"


class HubHandler(BaseHTTPRequestHandler):
    root: Path

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"hub: {self.command} {self.path}\n")

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {TOKEN}":
            return True
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Error-Message", "Invalid credentials in Authorization header")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
        return False

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path.startswith("/api/whoami-v2"):
            self._reply(200, {"type": "user", "name": "tester", "auth": {}})
        else:
            self._reply(404, {"error": f"not served here: GET {self.path}"})

    def do_POST(self) -> None:
        if not self._authorized():
            return
        body = self._body()
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts[:3] == ["api", "repos", "create"]:
            request = json.loads(body)
            repo = f"{request.get('organization') or 'tester'}/{request['name']}"
            (self.root / repo).mkdir(parents=True, exist_ok=True)
            self._reply(200, {"url": f"http://{self.headers['Host']}/{repo}", "name": repo})
        elif parts == ["api", "validate-yaml"]:
            self._validate_card(json.loads(body)["content"])
        elif parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] == "preupload":
            files = json.loads(body)["files"]
            modes = [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files
            ]
            self._reply(200, {"files": modes})
        elif parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] == "commit":
            self._commit(f"{parts[2]}/{parts[3]}", body)
        else:
            self._reply(404, {"error": f"not served here: POST {self.path}"})

    def _validate_card(self, content: str) -> None:
        """A README's YAML front matter must parse to a mapping (as the hub requires)."""
        _, _, rest = content.partition("---\n")
        front, found, _ = rest.partition("\n---")
        try:
            metadata = yaml.safe_load(front) if content.startswith("---\n") and found else None
        except yaml.YAMLError as e:
            metadata = f"{e}"
        if not isinstance(metadata, dict):
            self._reply(400, {"errors": [{"message": f"no YAML front matter mapping: {metadata}"}]})
        else:
            self._reply(200, {"warnings": []})

    def _commit(self, repo: str, body: bytes) -> None:
        directory = self.root / repo
        if not directory.is_dir():
            self._reply(404, {"error": f"repository {repo} not found"})
            return
        for line in body.decode().splitlines():
            entry = json.loads(line)
            if entry["key"] == "file":
                target = directory / entry["value"]["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(base64.b64decode(entry["value"]["content"]))
            elif entry["key"] != "header":
                self._reply(400, {"error": f"unsupported commit operation {entry['key']}"})
                return
        oid = hashlib.sha1(body).hexdigest()
        host = self.headers["Host"]
        self._reply(200, {"commitUrl": f"http://{host}/{repo}/commit/{oid}", "commitOid": oid})


def main(root: str, port: int) -> None:
    HubHandler.root = Path(root)
    ThreadingHTTPServer(("127.0.0.1", port), HubHandler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
