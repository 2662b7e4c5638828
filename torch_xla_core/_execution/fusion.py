"""A chain of graphs compiled as one executable (issue 43): what
_execution/pending.py launches for a step's torch.compile graphs. plan()
is the executor.Plan of such a chain for executor.executable: its Key (the
segments' keys and routing hashed into Key.graph, Key.fused the number of
graphs; the device, precision and replicas theirs) and its StableHLO
(module(): each graph's module made private functions of one module whose
main calls them in turn). So a fused executable takes the executor's one
compile path: its in-memory and persistent caches, TXC_DUMP_DIR, the
progress line, and a replicated compile where a graph holds collectives
across processes."""
import collections
import hashlib

from . import executor

__all__ = ["ChainPlan", "plan", "module"]


class ChainPlan(collections.namedtuple("ChainPlan", "key texts binds dead")):
    """executor.executable's plan of a chain: its Key, each graph's
    StableHLO, each graph's binds (pending._Chain's), the outputs it leaves
    out (nobody reads them: dead placeholders)."""
    cut = None  # (no traced graph behind it: the progress line counts graphs)

    def stablehlo(self) -> str:
        return module(self.texts, self.binds, self.dead)


def plan(segs, binds, dead=frozenset()) -> ChainPlan:
    """The ChainPlan of segments `segs` (replay/_session.py Segment: each
    one's Key and text) routed by `binds`, without the outputs `dead`."""
    keys = [s.key for s in segs]
    dead = tuple(sorted(dead))
    digest = hashlib.blake2b(repr((keys, tuple(binds), dead)).encode(), digest_size=8).digest()
    first = keys[0]
    replicas = next((k.replicas for k in keys if k.replicas is not None), None)
    key = executor.Key(int.from_bytes(digest, "little"), first.precision, first.device, first.platform, (), (),
                       None, replicas, (), len(keys))
    return ChainPlan(key, tuple(s.text for s in segs), tuple(binds), dead)


def module(texts, binds, dead=()) -> str:
    """One StableHLO module from several (see the module docstring): each module's
    functions made private under a prefix (s0_, s1_, ...), and a main that
    calls them in turn, parameter j of module s bound to main's parameter
    binds[s][j] (>= 0) or to output -1 - binds[s][j] of the modules before.
    It returns every module's outputs in turn, but those whose index (over
    all) is in `dead`: XLA frees those values inside the program once the
    graphs after have read them. The last module's donated parameters
    (tf.aliasing_output) stay donated, aliasing its outputs' new positions
    (not donated where that output is left out)."""
    from jax._src.interpreters import mlir as jmlir  # lazy: only when graphs are fused
    from jaxlib.mlir import ir  # lazy: as above
    from jaxlib.mlir.dialects import func  # lazy: as above

    with jmlir.make_ir_context(), ir.Location.unknown():
        out = ir.Module.create()
        mains = []  # (name, function type, arg attrs) per module
        for s, text in enumerate(texts):
            m = ir.Module.parse(text)
            attrs = m.operation.attributes  # (the module's: each graph's are alike but mhlo.num_replicas,
            for i in range(len(attrs)):     # which a graph with collectives across processes raises: the largest)
                name, attr = attrs[i].name, attrs[i].attr
                if name == "mhlo.num_replicas" and name in out.operation.attributes and \
                        ir.IntegerAttr(out.operation.attributes[name]).value >= ir.IntegerAttr(attr).value:
                    continue
                out.operation.attributes[name] = attr
            for op in list(m.body.operations):
                if "sym_name" not in op.attributes:
                    continue
                old = ir.StringAttr(op.attributes["sym_name"]).value
                new = f"s{s}_{old}"
                ir.SymbolTable.replace_all_symbol_uses(old, new, m.operation)
                op.attributes["sym_name"] = ir.StringAttr.get(new)
                if old == "main":
                    ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
                    arg_attrs = (list(ir.ArrayAttr(op.attributes["arg_attrs"])) if "arg_attrs" in op.attributes
                                 else [None] * len(ftype.inputs))
                    mains.append((new, ftype, arg_attrs))
                    for a in ("arg_attrs", "res_attrs"):
                        if a in op.attributes:
                            del op.attributes[a]
                op.attributes["sym_visibility"] = ir.StringAttr.get("private")
            for op in list(m.body.operations):
                out.body.append(op)
        n_args = 1 + max((a for b in binds for a in b), default=-1)
        total = sum(len(t.results) for _, t, _ in mains)
        kept = [i for i in range(total) if i not in dead]
        at = {i: p for p, i in enumerate(kept)}  # an output's index over all -> its position in main's results
        inputs, arg_attrs = [None] * n_args, [{} for _ in range(n_args)]
        n_before = sum(len(t.results) for _, t, _ in mains[:-1])
        for s, (_, ftype, attrs) in enumerate(mains):
            for j, a in enumerate(binds[s]):
                if a < 0:
                    continue
                inputs[a] = ftype.inputs[j]
                if s == len(mains) - 1 and attrs[j] is not None and "tf.aliasing_output" in ir.DictAttr(attrs[j]):
                    k = n_before + ir.IntegerAttr(ir.DictAttr(attrs[j])["tf.aliasing_output"]).value
                    if k in at:
                        arg_attrs[a]["tf.aliasing_output"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32),
                                                                                 at[k])
        results = [t for _, ftype, _ in mains for t in ftype.results]
        results = [results[i] for i in kept]
        with ir.InsertionPoint(out.body):
            main = func.FuncOp("main", ir.FunctionType.get(inputs, results))
            main.attributes["sym_visibility"] = ir.StringAttr.get("public")
            main.attributes["arg_attrs"] = ir.ArrayAttr.get([ir.DictAttr.get(d) for d in arg_attrs])
            entry = main.add_entry_block()
        with ir.InsertionPoint(entry):
            args, values = list(entry.arguments), []
            for s, (name, ftype, _) in enumerate(mains):
                operands = [args[a] if a >= 0 else values[-1 - a] for a in binds[s]]
                values.extend(func.CallOp(list(ftype.results), ir.FlatSymbolRefAttr.get(name), operands).results)
            func.ReturnOp([values[i] for i in kept])
        return str(out)
