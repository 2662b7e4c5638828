"""Lifting an optimizer's host-side state to device tensors before a step is
traced, so that what changes every step is a graph input, not a value baked
into the graph: Adam-family optimizers get capturable=True (step counts on
the device) and a 0-d device lr that LR schedulers fill_ in place
(txc.compile, and dynamo.py for torch.compile(opt.step))."""
import torch

LIFTABLE = {"Adam", "AdamW", "Adamax", "NAdam", "RAdam"}


def lift_optimizer(opt) -> None:
    """Adam-family optimizers: step counts and lr on the device, in place (once
    per optimizer; others, and fused or differentiable ones, are left as they are)."""
    if type(opt).__name__ not in LIFTABLE or getattr(opt, "_txc_lifted", False):
        return
    for g in opt.param_groups:
        dev = next((p.device for p in g["params"] if p.device.type == "xla"), None)
        if dev is None or g.get("fused") or g.get("differentiable"):
            return
    for g in opt.param_groups:
        dev = g["params"][0].device
        g["capturable"] = True
        if not isinstance(g["lr"], torch.Tensor):
            g["lr"] = torch.tensor(float(g["lr"]), dtype=torch.float32).to(dev)
        for p in g["params"]:
            st = opt.state.get(p)
            if st and isinstance(st.get("step"), torch.Tensor) and st["step"].device.type != "xla":
                st["step"] = st["step"].to(dev)
    opt._txc_lifted = True

