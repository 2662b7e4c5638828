"""Size report of built images: installed bytes by part (torch and its
dependencies, our package, the rest) measured inside each image, against
the size target (base + torch CPU + our wheel + jax, +10%), printed as a
table after a build.
"""

from __future__ import annotations

import json

from engine import Engine, ImageError, log

_SIZES = r"""
import importlib.metadata as md, json, os, sys
site = [p for p in sys.path if p.endswith("site-packages")][0]
def size(dist):
    n = 0
    for f in dist.files or []:
        p = os.path.join(site, str(f))
        if os.path.isfile(p) and not os.path.islink(p):
            n += os.path.getsize(p)
    return n
by = {d.metadata["Name"].lower().replace("_", "-"): size(d) for d in md.distributions()}
def closure(name):
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n in seen or n not in by:
            continue
        seen.add(n)
        for r in md.requires(n) or []:
            if "extra ==" in r:
                continue
            todo.append(r.split(";")[0].split("[")[0].split("=")[0].split("<")[0]
                        .split(">")[0].split("!")[0].split("~")[0].strip().lower().replace("_", "-"))
    return seen
torch = closure("torch")
ours = {"torch-xla-core"}
rest = set(by) - torch - ours
print(json.dumps({"torch_closure": sum(by[n] for n in torch),
                  "ours": sum(by[n] for n in ours),
                  "jax_and_rest": sum(by[n] for n in rest),
                  "largest": sorted(((by[n], n) for n in by), reverse=True)[:6]}))
"""


def measure(engine: Engine, image: str) -> dict:
    """Installed bytes by part (torch and its deps, our package, the rest:
    jax, jaxlib, numpy, scipy, ...) and the size target of the issue."""
    res = engine.run(image, ["python", "-c", _SIZES])
    if res.returncode:
        raise ImageError(f"measuring {image} failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def summary(engine: Engine, report: dict, *, sizes: bool = True) -> None:
    imgs = report.get("images", {})
    if not imgs:
        return
    base_b = report.get("base_bytes", 0)
    print(f"\nbase {report.get('base')}: {base_b / 2**20:.0f} MiB")
    print(f"{'flavor':<10} {'build s':>8} {'MiB':>6} {'target MiB':>11}  tags")
    for name, r in imgs.items():
        target = ""
        if sizes:
            try:
                m = measure(engine, r["tags"][0])
                r["measure"] = m
                # The target: base + torch CPU + our wheel, +10%;
                # jax/jaxlib (our hard dependency) are added to it as well.
                r["target_bytes"] = int(1.1 * (base_b + m["torch_closure"] + m["ours"]
                                                + m["jax_and_rest"]))
                r["target_bytes_without_jax"] = int(1.1 * (base_b + m["torch_closure"] + m["ours"]))
                target = f"{r['target_bytes'] / 2**20:.0f}"
            except ImageError as e:
                log(f"size measure skipped: {e}")
        print(f"{name:<10} {r['seconds']:>8} {r['bytes'] / 2**20:>6.0f} {target:>11}  "
              f"{' '.join(t.split(':', 1)[1] for t in r['tags'])}")
