"""torch_xla.debug.metrics (met) over txc.metrics, in torch_xla's names and
units: metric_data(name) is (total samples, accumulator, [(time, value)])
in nanoseconds (txc.metrics keeps seconds). Names: torch_xla's where
txc.metrics has an alias (txc.metrics.TIMER_ALIASES, COUNTER_ALIASES:
CompileTime, ExecuteTime, TransferToDeviceTime, TransferFromDeviceTime,
LoweringTime; CachedCompile, UncachedCompile, MarkStep; aten::<op> for an
operator run on the CPU as a fallback), else txc.metrics' own. Counters
and metrics only torch_xla's C++ runtime keeps (TensorToData, per-IR-op
xla::add) are not there: docs/porting.md."""
from .... import metrics

_NS = 1e9


def metric_data(name: str):
    """(total samples, accumulated nanoseconds, [(unix time in ns, ns)]) of a
    timer, or None when it never ran."""
    d = metrics.metric_data(name)
    if d is None:
        return None
    count, total, samples = d
    return count, int(total * _NS), [(int(t * _NS), int(s * _NS)) for t, s in samples]


def metric_names() -> list:
    """Timer names that have samples, ours and torch_xla's aliases of them."""
    return metrics.metric_names()


# torch_xla runs .item() (aten::_local_scalar_dense) on the CPU and counts it
# as a fallback; here it reads the value from the device, counted as scalar_read.
_SCALAR_READ = "aten::_local_scalar_dense"


def counter_value(name: str):
    """A counter's value, or None when it never counted; aten::<op> counts
    the op's CPU fallbacks (aten::_local_scalar_dense: Python numbers read
    from the device, as torch_xla counts them)."""
    if name == _SCALAR_READ:
        return metrics.counter_value("scalar_read")
    if "::" in name and not name.startswith(("aten::", "xla::")):  # another library's op (torchvision::nms)
        return metrics.counter_value("fallback::" + name)
    return metrics.counter_value(name)


def counter_names() -> list:
    """Counter names, with the CPU fallbacks as 'aten::<op>'."""
    return sorted(set(metrics.counter_names()) | set(executed_fallback_ops()))


def executed_fallback_ops() -> list:
    """The operators that ran on the CPU as a fallback, as 'aten::<op>' (another
    library's as it names them: 'torchvision::nms'), with
    aten::_local_scalar_dense once a Python number was read (torch_xla's
    list has it then)."""
    read = [_SCALAR_READ] if metrics.counter_value("scalar_read") else []
    return sorted({op if "::" in op else "aten::" + op for op in metrics.fallbacks()} | set(read))


def clear_counters() -> None:
    """Resets every counter."""
    metrics.clear_counters()


def clear_metrics() -> None:
    """Resets every timer."""
    metrics.clear_timers()


def clear_all() -> None:
    """Resets every counter and timer."""
    metrics.clear()


def _fmt_ns(ns) -> str:
    return f"{ns / 1e6:.3f}ms"


def _metric_lines(name) -> list:
    d = metric_data(name)
    if d is None:
        return []
    count, total, samples = d
    values = sorted(v for _, v in samples)
    lines = [f"Metric: {name}", f"  TotalSamples: {count}", f"  Accumulator: {_fmt_ns(total)}"]
    if values:
        pct = "; ".join(f"{q}%={_fmt_ns(values[min(len(values) - 1, len(values) * q // 100)])}"
                        for q in (1, 5, 10, 20, 50, 80, 90, 95, 99))
        lines.append(f"  Percentiles: {pct}")
    return lines


def _counter_lines(name) -> list:
    v = counter_value(name)
    return [] if v is None else [f"Counter: {name}", f"  Value: {v}"]


def metrics_report() -> str:
    """Every metric and counter, in torch_xla's report format."""
    lines = []
    for n in metric_names():
        lines += _metric_lines(n)
    for n in counter_names():
        lines += _counter_lines(n)
    return "\n".join(lines) + "\n"


def short_metrics_report(counter_names: list = None, metric_names: list = None) -> str:
    """The given counters and metrics (torch_xla's defaults when None), then
    every CPU fallback counter."""
    counter_names = counter_names or ["CachedCompile", "MarkStep", "DynamoSyncInputExecuteTime"]
    metric_names = metric_names or ["CompileTime", "ExecuteTime", "ExecuteReplicatedTime", "TransferToDeviceTime",
                                    "TransferFromDeviceTime"]
    lines = []
    for n in metric_names:
        lines += _metric_lines(n)
    for n in counter_names:
        lines += _counter_lines(n)
    for op in executed_fallback_ops():
        lines += _counter_lines(op)
    return "\n".join(lines) + "\n"
