#!/usr/bin/env python3
"""A PEP 503 "simple" package index per ABI flavor, as static pages, and a
local HTTP server for it.

Owns the index layout and serving; which files go into which flavor's
index is build/release.py's decision (the default flavor's index holds its
wheels and the sdist, as PyPI would; the other flavor's only its labelled
wheels). Layout, under one root:

    <flavor>/simple/index.html                   the project list
    <flavor>/simple/torch-xla-core/index.html    one link per file, with
                                                 #sha256= and data-requires-python
    <flavor>/files/<wheel or sdist>

Served over HTTP the root gives exactly the URLs users type:

    python build/pyindex.py serve release/index --port 8080
    pip install torch_xla_core --extra-index-url http://127.0.0.1:8080/cxx11/simple

Static pages, not pypiserver: PEP 503 pages are a few lines of HTML, the
same tree can be uploaded as it is to any static host (a bucket, as
PyTorch/XLA published its cxx11 wheels), and one server serves every
flavor under one port, which pypiserver (one /simple/ per server) does not.
The dependencies (torch, jax, jaxlib, numpy) are not mirrored: pip takes
them from the normal index, which --extra-index-url keeps.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import html
import re
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urljoin
from urllib.request import urlopen

_HREF = re.compile(r'<a href="([^"]+)"')


def normalize(name: str) -> str:
    """PEP 503 name normalization: torch_xla_core -> torch-xla-core."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _page(title: str, links: list[str]) -> str:
    body = "\n".join(links)
    return (f'<!DOCTYPE html>\n<html>\n<head><meta name="pypi:repository-version" '
            f'content="1.0"><title>{html.escape(title)}</title></head>\n'
            f"<body>\n<h1>{html.escape(title)}</h1>\n{body}\n</body>\n</html>\n")


def write_index(root: Path, name: str, files: list[Path], project: str,
                requires_python: str) -> Path:
    """Write index `name` (e.g. a flavor) under root holding copies of files
    for project; replaces what was there. Returns <root>/<name>/simple."""
    base = root / name
    shutil.rmtree(base, ignore_errors=True)
    (base / "files").mkdir(parents=True)
    proj = normalize(project)
    links = []
    for f in sorted(files, key=lambda p: p.name):
        dest = base / "files" / f.name
        shutil.copy2(f, dest)
        digest = hashlib.sha256(dest.read_bytes()).hexdigest()
        links.append(f'<a href="../../files/{quote(f.name)}#sha256={digest}" '
                     f'data-requires-python="{html.escape(requires_python)}">'
                     f"{html.escape(f.name)}</a><br>")
    simple = base / "simple"
    (simple / proj).mkdir(parents=True)
    (simple / proj / "index.html").write_text(_page(f"Links for {proj}", links))
    (simple / "index.html").write_text(
        _page("Simple index", [f'<a href="{proj}/">{proj}</a><br>']))
    return simple


def listed_files(simple_url: str, project: str) -> list[str]:
    """The file names the index at simple_url offers for project (what pip
    sees), read over HTTP (or file://)."""
    url = urljoin(simple_url.rstrip("/") + "/", normalize(project) + "/")
    with urlopen(url, timeout=30) as r:
        text = r.read().decode()
    return sorted(unquote(h.split("#")[0].rsplit("/", 1)[-1]) for h in _HREF.findall(text))


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no access log on stderr
        pass


@contextlib.contextmanager
def served(root: Path, port: int = 0, host: str = "127.0.0.1"):
    """Serve root over HTTP on host:port (0: a free port) in a thread; yields
    the base URL, e.g. http://127.0.0.1:41234 (append /<flavor>/simple)."""
    handler = functools.partial(_Quiet, directory=str(root))
    httpd = ThreadingHTTPServer((host, port), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://{host}:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve an index root on 127.0.0.1 until interrupted")
    s.add_argument("root", type=Path)
    s.add_argument("--port", type=int, default=8080)
    a = p.parse_args(argv)
    if not a.root.is_dir():
        p.error(f"{a.root} is not a directory: run `nox -s release` (or build/release.py) first")
    names = sorted(d.name for d in a.root.iterdir() if (d / "simple").is_dir())
    with served(a.root, a.port) as url:
        for n in names:
            print(f"{n:10s} {url}/{n}/simple/", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
