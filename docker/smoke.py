"""Smoke test of a torch_xla_core image: the installed flavor is the one the
image names, and a short traced training step runs on the CPU.

    python /opt/torch-xla-core/smoke.py --flavor cxx11 [--build-check]

--build-check (used by docker/Dockerfile while the image is built) stops
after the import and flavor checks (and --export-overlay DIR then copies
the files the wheel installed, from its RECORD, under DIR at their
absolute paths, for the runtime stage to COPY); without it a tiny MLP trains 3 steps
on the xla device (txc.sync() each step) and must match the same steps on
CPU eager, with one compile for the step graph. Exit status 1 names what
disagreed. Needs only the image's own Python environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def fail(msg: str) -> None:
    print(f"smoke: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def check_flavor(want: str, cxx11_abi: str | None, version: str | None) -> dict:
    import torch_xla_core as txc

    info = txc.build_info()
    errors = []
    if info["flavor"] != want:
        errors.append(f"the image is tagged for flavor {want!r} but the installed "
                      f"core is {info['flavor']!r} (cxx11_abi={info['cxx11_abi']})")
    if cxx11_abi is not None and info["cxx11_abi"] != (cxx11_abi == "1"):
        errors.append(f"CXX11_ABI={cxx11_abi} but the core was compiled with "
                      f"_GLIBCXX_USE_CXX11_ABI={int(info['cxx11_abi'])}")
    if version is not None and info["version"] != version:
        errors.append(f"installed torch_xla_core {info['version']}, the image says {version}")
    if info["flavor_consistent"] is not True:
        errors.append(f"version label {info['local_label']!r} does not match the "
                      f"compiled ABI (flavor {info['flavor']})")
    if not info["torch"] or not info["jaxlib"]:
        errors.append(f"torch={info['torch']} jaxlib={info['jaxlib']}: runtime deps missing")
    if errors:
        fail("; ".join(errors))
    return info


def train_step_check() -> dict:
    import torch
    import torch.nn.functional as F

    import torch_xla_core as txc

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g))
            for _ in range(3)]

    def run(device, sync):
        import copy
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        losses = []
        for x, y in data:
            loss = F.cross_entropy(m(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
            if sync:
                sync()
            losses.append(loss.item())
        return losses, m

    cpu_losses, cpu_model = run("cpu", None)
    before = dict(txc.metrics.counters())
    xla_losses, xla_model = run(txc.device(), txc.sync)
    after = txc.metrics.counters()
    torch.testing.assert_close(torch.tensor(xla_losses), torch.tensor(cpu_losses),
                               rtol=1e-4, atol=1e-5)
    for (k, a), (_, b) in zip(cpu_model.state_dict().items(), xla_model.state_dict().items()):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-4, atol=1e-5, msg=k)
    delta = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    fallbacks = {k: v for k, v in delta.items() if "fallback" in k.lower()}
    if fallbacks:
        fail(f"CPU fallbacks during the training step: {fallbacks}")
    return {"losses": [round(v, 5) for v in xla_losses], "device": str(txc.device()),
            "counters": delta}


def export_overlay(dest: str) -> int:
    import importlib.metadata as md
    import shutil

    dist = md.distribution("torch_xla_core")
    n = 0
    for f in dist.files or []:
        src = os.path.realpath(dist.locate_file(f))
        if not os.path.isfile(src):
            continue
        out = os.path.join(dest, src.lstrip("/"))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        shutil.copy2(src, out)
        n += 1
    if not n:
        fail("torch_xla_core's RECORD lists no installed files")
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flavor", default=os.environ.get("TXC_FLAVOR"), required=False)
    p.add_argument("--cxx11-abi", choices=["0", "1"], default=None)
    p.add_argument("--version", default=None)
    p.add_argument("--build-check", action="store_true")
    p.add_argument("--export-overlay", metavar="DIR")
    a = p.parse_args()
    if not a.flavor:
        fail("no flavor to check against (--flavor or TXC_FLAVOR)")
    info = check_flavor(a.flavor, a.cxx11_abi, a.version)
    out = {"flavor": info["flavor"], "version": info["version"], "torch": info["torch"],
           "jaxlib": info["jaxlib"], "uid": os.getuid()}
    if not a.build_check:
        out["train"] = train_step_check()
    if a.export_overlay:
        out["overlay_files"] = export_overlay(a.export_overlay)
    print("smoke: OK " + json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
