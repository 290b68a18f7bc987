"""Two local servers on 127.0.0.1 that stand in for the network in the download and publishing tests.

- :func:`serve_folder`: the standard library's static file server (``http.server``) over a folder,
  what a plain ``https://.../releases/download/...`` URL is.
- :class:`LocalHub`: the part of the Hugging Face Hub's HTTP interface that ``huggingface_hub`` uses
  to download (``HEAD``/``GET /<repo>/resolve/<revision>/<file>`` with the ``ETag``, ``X-Repo-Commit``
  and ``Content-Length`` headers ``hf_hub_download`` requires, ``X-Error-Code`` on a 404) and to
  publish (``/api/repos/create``, ``/api/validate-yaml``, the ``preupload`` and ``commit`` endpoints
  of ``HfApi.create_commit``, every file sent inline as base64). Repositories keep their history:
  each commit is a new 40-hex id, and a file is served at ``main`` or at any commit id that holds it.
  A private repository, and every write when a token is set, answer 401 unless the request carries
  ``Authorization: Bearer <token>``.

Nothing here is a mock of aggzoo: the real ``huggingface_hub`` client and torch.hub's downloader
talk HTTP to these servers. Run as a script to serve a folder of repositories by hand::

    python tests/hub/hub_servers.py --port 8765   # then HF_ENDPOINT=http://127.0.0.1:8765
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import yaml


@contextmanager
def _serving(server: ThreadingHTTPServer) -> Iterator[str]:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _QuietFiles(SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, format: str, *args: object) -> None:
        type(self).requests.append(self.path)


@contextmanager
def serve_folder(root: Path) -> Iterator[tuple[str, list[str]]]:
    """``(base URL, list of requested paths)`` of a static file server over ``root``."""
    handler = type("Files", (_QuietFiles,), {"requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    with _serving(server) as url:
        yield url, handler.requests


@dataclass
class _Repo:
    private: bool = False
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    main: str | None = None


@dataclass
class LocalHub:
    """The repositories of a local Hugging Face-style endpoint. ``requests`` records
    ``(method, path, Authorization header)`` of every request, in order."""

    token: str | None = None
    url: str = ""
    repos: dict[str, _Repo] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)

    def create(self, repo_id: str, *, private: bool = False) -> None:
        self.repos.setdefault(repo_id, _Repo(private=private))

    def commit(self, repo_id: str, files: dict[str, bytes]) -> str:
        """Add (or replace) ``files`` on ``main`` in one new commit; returns its id."""
        repo = self.repos.setdefault(repo_id, _Repo())
        tree = dict(repo.commits.get(repo.main, {})) if repo.main else {}
        tree.update(files)
        oid = hashlib.sha1(f"{repo_id}:{len(repo.commits)}:{sorted(tree)}".encode()).hexdigest()
        repo.commits[oid] = tree
        repo.main = oid
        return oid

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        repo = self.repos[repo_id]
        return repo.commits[repo.main if revision == "main" else revision]

    @contextmanager
    def serve(self) -> Iterator[str]:
        with _serving(ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))) as url:
            self.url = url
            yield url

    # -- the handlers ------------------------------------------------------------------------------

    def _record(self, request: BaseHTTPRequestHandler) -> list[str]:
        self.requests.append((request.command, request.path, request.headers.get("Authorization")))
        return [unquote(p) for p in urlparse(request.path).path.strip("/").split("/")]

    def _authorised(self, request: BaseHTTPRequestHandler) -> bool:
        return self.token is None or request.headers.get("Authorization") == f"Bearer {self.token}"

    def _allowed(self, request: BaseHTTPRequestHandler, repo: _Repo) -> bool:
        return not repo.private or self._authorised(request)

    def _resolve(self, request: BaseHTTPRequestHandler, *, body: bool) -> None:
        parts = self._record(request)
        if len(parts) < 5 or parts[2] != "resolve":
            return _send(request, 404, error="RepoNotFound")
        repo_id, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        repo = self.repos.get(repo_id)
        if repo is None or not self._allowed(request, repo):
            return _send(request, 401, error="RepoNotFound")
        commit = repo.main if revision == "main" else revision
        if commit not in repo.commits:
            return _send(request, 404, error="RevisionNotFound")
        data = repo.commits[commit].get(filename)
        if data is None:
            return _send(request, 404, error="EntryNotFound", commit=commit)
        request.send_response(200)
        request.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        request.send_header("X-Repo-Commit", commit)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        if body:
            request.wfile.write(data)

    def _api(self, request: BaseHTTPRequestHandler) -> None:
        parts = self._record(request)
        raw = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        base = f"http://127.0.0.1:{request.server.server_address[1]}"
        if parts != ["api", "validate-yaml"] and not self._authorised(request):
            # Every write needs the token, as on the Hub (401 on the API: "Invalid username or password").
            return _send(request, 401, {"error": "Invalid username or password."})
        if parts[:2] == ["api", "repos"] and parts[2:] == ["create"]:
            payload = json.loads(raw)
            repo_id = f"{payload['organization']}/{payload['name']}"
            if repo_id in self.repos:
                return _send(request, 409, {"error": "You already created this model repo", "url": f"{base}/{repo_id}"})
            self.create(repo_id, private=payload.get("visibility") == "private" or bool(payload.get("private")))
            return _send(request, 200, {"url": f"{base}/{repo_id}", "name": repo_id})
        if parts == ["api", "validate-yaml"]:
            return self._validate_yaml(request, json.loads(raw)["content"])
        if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] in ("preupload", "commit"):
            repo_id = "/".join(parts[2:4])
            repo = self.repos.get(repo_id)
            if repo is None or not self._allowed(request, repo):
                return _send(request, 401, error="RepoNotFound")
            if parts[4] == "preupload":
                files = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                         for f in json.loads(raw)["files"]]
                return _send(request, 200, {"files": files})
            lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
            added = {item["value"]["path"]: base64.b64decode(item["value"]["content"])
                     for item in lines if item["key"] == "file"}
            oid = self.commit(repo_id, added)
            return _send(request, 200, {"commitUrl": f"{base}/{repo_id}/commit/{oid}", "commitOid": oid,
                                        "pullRequestUrl": None})
        _send(request, 404, {"error": f"no such endpoint: {request.path}"})

    def _validate_yaml(self, request: BaseHTTPRequestHandler, content: str) -> None:
        """The Hub refuses a model card whose front matter is not a YAML mapping."""
        if not content.startswith("---\n") or "\n---\n" not in content[4:]:
            return _send(request, 200, {"errors": [], "warnings": [{"message": "empty or missing yaml metadata"}]})
        try:
            metadata = yaml.safe_load(content[4:].split("\n---\n", 1)[0])
        except yaml.YAMLError as error:
            return _send(request, 400, {"errors": [{"message": str(error)}]})
        if not isinstance(metadata, dict):
            return _send(request, 400, {"errors": [{"message": "metadata must be a mapping"}]})
        _send(request, 200, {"errors": [], "warnings": []})


def _send(request: BaseHTTPRequestHandler, status: int, payload: dict | None = None, *, error: str | None = None,
          commit: str | None = None) -> None:
    body = json.dumps(payload or {"error": error or ""}).encode()
    request.send_response(status)
    request.send_header("Content-Type", "application/json")
    request.send_header("Content-Length", str(len(body)))
    if error is not None:
        request.send_header("X-Error-Code", error)
    if commit is not None:
        request.send_header("X-Repo-Commit", commit)
    request.end_headers()
    if request.command != "HEAD":
        request.wfile.write(body)


def _handler(hub: LocalHub, *, log: bool = False) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            if log:
                print(self.command, self.path, flush=True)

        def do_HEAD(self) -> None:
            hub._resolve(self, body=False)

        def do_GET(self) -> None:
            hub._resolve(self, body=True)

        def do_POST(self) -> None:
            hub._api(self)

    return Handler


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="serve an empty local Hugging Face-style hub until Ctrl-C")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    print(f"HF_ENDPOINT=http://127.0.0.1:{args.port}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", args.port), _handler(LocalHub(), log=True)).serve_forever()
