"""Per-site choice on the Inductor route: a fused op stays where it beats the code Inductor generates for the same
site; where Inductor's code is faster the fused op is lowered back to aten ops (``lower``) and Inductor generates
its own loop for it, fused with its neighbours.

Why after fusion and not instead of it: the passes match every site as before (``stats.patterns``, the explain
report and the site counts stay the whole truth about the model), and the choice is one step over the fused graph,
per node, with the shapes and dtypes Inductor will compile for (``node.meta["val"]``).

The decision is a cost model fitted to measurements (``CostModel``): for each family, device, dtype and thread
count, the ratio (Inductor's time for the site) / (the fused op's time, called from Inductor's wrapper) measured at
sizes from 1 Ki to 4 Mi elements, interpolated in log size (below 1 Ki the ratio shrinks with the size: there
the fused op costs its fixed call, Inductor's inline code almost nothing). A site is fused when the ratio at its
size is at least ``1 + MARGIN`` *and* the time it saves, (ratio - 1) x the fused op's measured time, is at least
``CONTEXT_US`` for the device. Both pay for what an isolated measurement cannot see: in a model the fused op is an
extern call that cuts Inductor's fusion with the site's neighbours (its inputs materialised in the layout it takes,
its output written out for its consumers). On the zoo that cost ~5 us per site on CPU whatever the site's size
(PRX: 6 small rope/gelu sites predicted 1.35-1.48x faster cost 28 us per call in the model; HiDream: 4 rope sites,
~25 us), more than a small site can save, so a ratio alone kept sites that lost. The
measurements come from ``python -m fusegraph bench calibrate`` (``calibrate`` here), which writes them to the cache
directory; tables measured on the development machine ship with the package (``cost_cpu.json``) and are used
until the user calibrates their own. On CPU the tables are kept per CPU class (``cpu@<vendor/class>``,
``_core.cpu_class``: the fused kernels and Inductor's code both change with the vector ISA); the development
machine's narrower classes are measured by emulation (``python -m fusegraph --cpu-class avx2 bench calibrate``). A
CPU class without a table gets the least favourable prediction over the classes measured: a site stays fused only
where the fused op won on every one of them. A device without a table (CUDA/NPU until calibrated there) keeps every
fused op, the behaviour before this choice existed.
"""
from __future__ import annotations

import copy
import functools
import json
import logging
import math
import os
import threading
import time
from typing import Optional

import torch
import torch.fx

from .._core.measure import paired_medians, sync_for
from .._core import cache, cpu_class
from .._core.cache import number, read_json
from .patterns import BY_NAME, FAMILIES, PATTERN_NAMES
from .patterns._family import overload
from .patterns._lowering import ROW

log = logging.getLogger("fusegraph")

MARGIN = 0.05
# The time a fused site must save over Inductor's code (per call, microseconds) to stay fused: the in-context cost
# of an extern call measured on the zoo (module docstring). Devices without an entry: no such bar.
CONTEXT_US = {"cpu": 5.0}
# The families the choice weighs (elementwise and row-wise sites Inductor would otherwise generate code for): those
# with a calibration site in the family table. kv_attention and gemv are not among them: they replace extern calls
# (SDPA, mm) for which Inductor generates no code of its own, so those sites stay fused.
CALIBRATED = tuple(f.name for f in FAMILIES if f.calibrated)
TABLE_VERSION = 2  # 2: each point also holds the fused op's time (v1 tables, ratios only, are not read)
_SHIPPED = os.path.join(os.path.dirname(__file__), "cost_cpu.json")

@functools.lru_cache(maxsize=None)
def _ops() -> dict:
    """op overload -> the families (in pass order) whose fused op it is and that the choice may lower."""
    by_op: dict = {}
    for f in FAMILIES:
        for name in f.lowerings:
            by_op.setdefault(overload(name), []).append(f)
    return {op: tuple(fams) for op, fams in by_op.items()}


def family_of(node: torch.fx.Node) -> Optional[str]:
    """The pattern family (stats name) a fused node the choice weighs belongs to, or None for any other node
    (an op several families emit goes to the one whose ``claims`` holds)."""
    if node.op != "call_function":
        return None
    families = _ops().get(node.target, ())
    if len(families) == 1:
        return families[0].name
    return next((f.name for f in families if f.claims is not None and f.claims(node)), None)


# ---------------------------------------------------------------------------------------------------------
# Lowering: each fused op as plain torch ops with the op's exact semantics (``Family.lowerings``: math in float32,
# float64 when an argument is float64; rounded once to the op's output dtype, which the node's "val" carries).


def _lowering(node):
    kw = dict(node.kwargs)
    if "out_dtype" in kw:  # the op's own keyword; the output dtype comes from the node's val
        kw["out_dtype_arg"] = kw.pop("out_dtype")
    return _lowerings()[node.target], kw


@functools.lru_cache(maxsize=None)
def _lowerings() -> dict:
    """op overload -> its lowering, from the family table (one function per op, whichever families emit it)."""
    found: dict = {}
    for f in FAMILIES:
        for name, fn in f.lowerings.items():
            if found.setdefault(overload(name), fn) is not fn:
                raise ValueError(f"two lowerings of fusegraph.{name} in the family table")
    return found


def lowered_call(target, *args, **kwargs):
    """``target(*args, **kwargs)`` (a fused op overload) computed by its lowering; what ``lower`` inserts. For
    tests: it must equal the op."""
    node = torch.fx.Graph().create_node("call_function", target, (), kwargs)
    fn, kw = _lowering(node)
    out = target(*args, **kwargs)  # the output dtype, as the op defines it
    return fn(out.dtype, *args, **kw)


def lower(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """Replaces the fused ``node`` by its lowering to aten ops (traced under the graph's fake mode with
    Inductor's decompositions, so every new node has its "val")."""
    from .._core.torch_fake import detect_fake_mode
    from .._core.torch_inductor import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    fn, kw = _lowering(node)
    out_val = node.meta["val"]
    tensor_nodes = []

    def spec(a):
        if isinstance(a, torch.fx.Node):
            tensor_nodes.append(a)
            return ("tensor", len(tensor_nodes) - 1)
        return ("const", a)

    specs = [spec(a) for a in node.args]
    kw_specs = {k: spec(v) for k, v in kw.items()}  # weight=/bias= may come as keywords
    vals = [n.meta["val"] for n in tensor_nodes]
    fake_mode = detect_fake_mode(vals + [out_val])

    def body(*tensors):
        def value(s):
            return tensors[s[1]] if s[0] == "tensor" else s[1]

        return fn(out_val.dtype, *[value(s) for s in specs], **{k: value(s) for k, s in kw_specs.items()})

    with fake_mode:
        sub = make_fx(body, decomposition_table=select_decomp_table(), tracing_mode="real")(*vals)
    env = {}
    result = None
    placeholders = iter(tensor_nodes)
    with graph.inserting_before(node):
        for n in sub.graph.nodes:
            if n.op == "placeholder":
                env[n] = next(placeholders)
            elif n.op == "output":
                result = env[n.args[0]]
            elif n.op == "get_attr":
                raise RuntimeError(f"lowering of {node.target} made a constant tensor")
            else:
                new = graph.node_copy(n, lambda a: env[a])
                new.meta.setdefault("stack_trace", node.meta.get("stack_trace"))
                env[n] = new
    node.replace_all_uses_with(result)
    graph.erase_node(node)


# ---------------------------------------------------------------------------------------------------------
# The cost model


def _device_key(device: torch.device) -> str:
    """The key a device's measurements are kept under: ``cpu@<vendor/class>`` on CPU (``_core.cpu_class``: what is
    faster differs between CPU classes), the device type elsewhere."""
    if device.type == "cpu":
        return f"cpu@{cpu_class.key()}"
    return device.type


def _checked_table(data) -> dict:
    """A cost-table file's content when it has this version's shape (``CostModel.tables``: device -> thread count ->
    family -> dtype -> points ``[log2 numel, ratio(, fused op's time)]`` in increasing numel), else ValueError or
    TypeError saying what is wrong."""
    if not isinstance(data, dict) or data.get("version") != TABLE_VERSION:
        raise ValueError(f"not a version-{TABLE_VERSION} cost table")
    tables = data.get("tables")
    if not isinstance(tables, dict):
        raise TypeError("'tables' is not an object")
    for dev, per_threads in tables.items():
        if not isinstance(per_threads, dict):
            raise TypeError(f"tables[{dev!r}] is not an object")
        for threads, families in per_threads.items():
            if not str(threads).isdigit() or int(threads) < 1 or not isinstance(families, dict):
                raise ValueError(f"tables[{dev!r}][{threads!r}]: expected a thread count holding an object")
            for family, per_dtype in families.items():
                if not isinstance(per_dtype, dict):
                    raise TypeError(f"tables[{dev!r}][{threads!r}][{family!r}] is not an object")
                for dtype, points in per_dtype.items():
                    where = f"tables[{dev!r}][{threads!r}][{family!r}][{dtype!r}]"
                    if not isinstance(points, list) or not points:
                        raise TypeError(f"{where}: expected a list of points")
                    xs = []
                    for p in points:
                        if not isinstance(p, list) or len(p) not in (2, 3):
                            raise TypeError(f"{where}: a point is not [log2 numel, ratio(, time)]")
                        xs.append(number(p[0]))
                        if number(p[1]) <= 0 or (len(p) == 3 and number(p[2]) < 0):
                            raise ValueError(f"{where}: a ratio or time out of range")
                    if any(b <= a for a, b in zip(xs, xs[1:])):
                        raise ValueError(f"{where}: numel not increasing")
    return data


class CostModel:
    """Measured ratios t(Inductor's code) / t(fused op) by (device, threads, family, dtype), over log2(numel)."""

    def __init__(self, tables: dict, source: str):
        self.tables = tables  # {"cpu": {"1": {family: {dtype: [[log2 numel, ratio], ...]}}}}
        self.source = source

    @classmethod
    def load(cls) -> "CostModel":
        """The shipped table, with the user's calibration (cache dir) over it: each (device or class, threads,
        family, dtype and row width) the user measured replaces the shipped entry; the rest stays (a partial
        ``bench calibrate``, one family or one more row width, keeps every other prediction)."""
        shipped = read_json(_SHIPPED, _checked_table)  # a malformed file: one warning, then without it
        user = read_json(calibration_path(), _checked_table)
        if shipped is None and user is None:
            return cls({}, "none")
        tables = copy.deepcopy(shipped["tables"]) if shipped is not None else {}
        for dev, per_threads in (user["tables"] if user is not None else {}).items():
            for threads, families in per_threads.items():
                table = tables.setdefault(dev, {}).setdefault(threads, {})
                for family, per_key in families.items():
                    table.setdefault(family, {}).update(per_key)
        if user is None:
            source = _SHIPPED
        else:
            source = calibration_path() + ("" if shipped is None else f" (over {_SHIPPED})")
        return cls(tables, source)

    def ratio(self, family: str, device: torch.device, dtype: torch.dtype, numel: int,
              threads: Optional[int] = None) -> Optional[float]:
        """Predicted t(Inductor) / t(fused) for one site; None when nothing was measured for this device."""
        return self.predict(family, device, dtype, numel, threads)[0]

    def predict(self, family: str, device: torch.device, dtype: torch.dtype, numel: int,
                threads: Optional[int] = None, row: Optional[int] = None) -> tuple:
        """(t(Inductor) / t(fused), the fused op's time in microseconds) for one site of ``numel`` elements in rows
        of ``row`` (a row-wise family's table answers from the measured row width nearest it; None: the table's
        default width); (None, None) when nothing was measured, the time None when the table has ratios only."""
        candidates = self._tables_for(device)
        if not candidates:
            return None, None
        # a class with no table of its own: the least favourable prediction over every class measured, so a site
        # stays fused only where the fused op won on each of them
        return min((self._predict(t, family, dtype, numel, threads, row) for t in candidates),
                   key=lambda p: (p[0] is None, p[0] if p[0] is not None else 0.0))

    def _tables_for(self, device: torch.device) -> list:
        """The per-thread tables that answer for ``device``: its class's own; else a table kept under the bare
        device type (a calibration from before classes, this machine's); else, on CPU, every class's."""
        key = _device_key(device)
        if self.tables.get(key):
            return [self.tables[key]]
        if self.tables.get(device.type):
            return [self.tables[device.type]]
        if device.type == "cpu":
            return [t for k, t in sorted(self.tables.items()) if k.startswith("cpu@") and t]
        return []

    @staticmethod
    def _predict(per_device: dict, family: str, dtype: torch.dtype, numel: int, threads: Optional[int],
                 row: Optional[int] = None) -> tuple:
        threads = torch.get_num_threads() if threads is None else threads
        key = min(per_device, key=lambda k: (abs(int(k) - threads), int(k)))  # nearest measured thread count
        points = _points_for_row(per_device[key].get(family, {}), str(dtype).replace("torch.", ""), row)
        if not points:
            return None, None
        x = math.log2(max(numel, 1))
        timed = all(len(p) > 2 and p[2] > 0 for p in points)
        if x <= points[0][0]:  # below the table the fused op's time is its fixed call cost while Inductor's code
            ratio = points[0][1] * 2.0 ** (x - points[0][0])  # (inline in a kernel) shrinks with the site: ~numel
            return ratio, (points[0][2] if timed else None)
        for p0, p1 in zip(points, points[1:]):
            if x <= p1[0]:
                f = (x - p0[0]) / (p1[0] - p0[0])
                ratio = p0[1] + (p1[1] - p0[1]) * f
                return ratio, (2.0 ** (math.log2(p0[2]) + (math.log2(p1[2]) - math.log2(p0[2])) * f) if timed
                               else None)  # the time interpolated in log-log
        last = points[-1]
        return last[1], (last[2] * 2.0 ** (x - last[0]) if timed else None)  # above: the time ~ numel


def _points_for_row(per_dtype: dict, dtype: str, row: Optional[int]) -> Optional[list]:
    """A family's points for ``dtype`` at the measured row width nearest ``row`` in log scale (the key ``dtype``
    holds the calibration's default width, ``ROW``; ``dtype@<row>`` others); the default width's when ``row`` is
    None or no other width was measured."""
    widths = {ROW: per_dtype.get(dtype)}
    for k, points in per_dtype.items():
        name, _, width = k.partition("@")
        if name == dtype and width.isdigit() and int(width) > 0:
            widths[int(width)] = points
    widths = {w: p for w, p in widths.items() if p}
    if not widths:
        return None
    if row is None or len(widths) == 1:
        return widths.get(ROW) or next(iter(widths.values()))
    x = math.log2(max(row, 1))
    return widths[min(widths, key=lambda w: (abs(math.log2(w) - x), w))]


def _row_key(dtype: torch.dtype, row: int) -> str:
    """The cost table's key for ``dtype`` at row width ``row``."""
    name = str(dtype).replace("torch.", "")
    return name if row == ROW else f"{name}@{row}"


_model: Optional[CostModel] = None
_model_lock = threading.Lock()


def cost_model(reload: bool = False) -> CostModel:
    global _model
    with _model_lock:
        if _model is None or reload:
            _model = CostModel.load()
        return _model


def calibration_path() -> str:
    return cache.path(f"cost_v{TABLE_VERSION}.json")


def _hint(n) -> Optional[int]:
    """An int, or a symbolic size's example value, without a guard (int() would specialise the graph to it)."""
    if isinstance(n, torch.SymInt):
        n = getattr(n.node, "hint", None)
    return int(n) if isinstance(n, int) else None


def _site_size(node) -> tuple:
    """(dtype, numel) a site is judged by: its output's."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None, None
    return val.dtype, _hint(val.numel())


def _site_row(node) -> Optional[int]:
    """The row width a site is judged by (its output's last dimension), or None."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() == 0:
        return None
    return _hint(val.shape[-1])


def decide(node: torch.fx.Node) -> tuple:
    """(keep the fused op?, predicted t(Inductor) / t(fused) or None) for one fused node: kept when the cost
    model has no measurement for its device/family/dtype, or predicts the fused op at least MARGIN faster and
    saving at least CONTEXT_US per call."""
    keep, ratio, _ = _decide(node)
    return keep, ratio


def _decide(node: torch.fx.Node) -> tuple:
    """(keep?, ratio or None, predicted microseconds saved per call or None)."""
    family = family_of(node)
    dtype, numel = _site_size(node)
    if family is None or dtype is None or numel is None:
        return True, None, None
    if _float64_args(node):  # the op runs such calls as plain torch ops, not its kernel: Inductor's code is better
        return False, None, None
    device = node.meta["val"].device
    ratio, fused_us = cost_model().predict(family, device, dtype, numel, row=_site_row(node))
    if ratio is None:
        return True, None, None
    saved = None if fused_us is None else (ratio - 1) * fused_us
    keep = ratio >= 1 + MARGIN and (saved is None or saved >= CONTEXT_US.get(device.type, 0.0))
    return keep, ratio, saved


def _float64_args(node: torch.fx.Node) -> bool:
    vals = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    return any(isinstance(v, torch.Tensor) and v.dtype == torch.float64 for v in vals)


def describe(node: torch.fx.Node) -> str:
    """The Inductor route's choice for one fused node, as the explain report shows it."""
    keep, ratio, saved = _decide(node)
    if ratio is None:
        return ("Inductor code (float64 arguments: no fused kernel)" if not keep else
                "fused op (no measurement for this device/dtype)")
    gain = "" if saved is None else f", saves {saved:.1f} us"
    return f"{'fused op' if keep else 'Inductor code'} (Inductor/fused time {ratio:.2f}{gain})"


def choose(graph: torch.fx.Graph, config=None, *, stats=None, decisions: Optional[list] = None) -> dict:
    """Lowers every fused node that Inductor's own code is predicted to beat; returns {family: sites lowered}
    and appends (family, node name, dtype, numel, ratio, fused?) to ``decisions`` when given."""
    lowered = {name: 0 for name in PATTERN_NAMES}
    for node in list(graph.nodes):
        family = family_of(node)
        if family is None:
            continue
        keep, ratio = decide(node)
        dtype, numel = _site_size(node)
        if decisions is not None:
            decisions.append((family, node.name, dtype, numel, ratio, keep))
        if keep:
            continue
        try:
            lower(graph, node)
        except Exception as e:  # keep the fused op: it is correct, only maybe slower
            log.warning("fusegraph: could not lower %s (%s: %s); keeping the fused op", node.name, type(e).__name__, e)
            continue
        lowered[family] += 1
    if any(lowered.values()):
        graph.eliminate_dead_code()
        graph.lint()
    if stats is not None:
        stats.add_lowered(lowered)
    return lowered


# ---------------------------------------------------------------------------------------------------------
# Calibration: ``python -m fusegraph bench calibrate``

def _site_args(family: str, numel: int, dtype, device, row: int = None):
    """(op overload, args, kwargs): the family's representative site (``Family.calibration``) at ``numel``
    elements (in rows of ``row`` for a row-wise family; None: its default width), random values of ``dtype`` on
    ``device``."""
    f = BY_NAME.get(family)
    if f is None or not f.calibrated:
        raise ValueError(f"unknown family {family!r}")
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=g, dtype=torch.float32).to(dt).to(device)

    if f.row_wise and row is not None:
        return f.calibration(numel, rnd, row=row)
    return f.calibration(numel, rnd)


def _inductor_fn(target, args, kwargs):
    """Inductor's compiled code for the lowering of one fused call (what it generates for the site)."""
    from .._core.torch_inductor import compile_fx_inner
    from .._core.torch_inductor import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    where = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    out_dtype = target(*args, **kwargs).dtype
    node = torch.fx.Graph().create_node("call_function", target, (), kwargs)
    fn, kw = _lowering(node)

    def body(*ts):
        full = list(args)
        for i, t in zip(where, ts):
            full[i] = t
        return (fn(out_dtype, *full, **kw),)

    with torch.no_grad():
        gm = make_fx(body, decomposition_table=select_decomp_table(), tracing_mode="fake")(*tensors)
        compiled = compile_fx_inner(gm, tensors)
    return lambda: compiled(list(tensors))


def _overhead_seconds(device) -> float:
    """The per-call cost of a compiled graph's wrapper around one tiny kernel: subtracted from Inductor's
    measurements (in a model the site's code runs inside the model's kernels, without a call of its own)."""
    from .._core.torch_inductor import compile_fx_inner
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(8, device=device)
    with torch.no_grad():
        gm = make_fx(lambda t: (t + 1,), tracing_mode="fake")(x)
        compiled = compile_fx_inner(gm, [x])
    return paired_medians([lambda: compiled([x])], sync=sync_for(device))[0]


def calibrate(device="cpu", dtypes=(torch.float32, torch.bfloat16, torch.float16), threads=None,
              sizes=tuple(2 ** k for k in range(10, 23, 3)), families=None, progress=None, rows=(ROW,)) -> dict:
    """Measures the table the cost model reads, for this device and thread count; returns it (merged into the
    existing calibration file by ``save_calibration``). ``rows``: the row widths a row-wise family (a norm) is
    measured at, each under its own key (``_row_key``); sizes below one row are skipped there. The other
    families are measured at their default width once."""
    device = torch.device(device)
    threads = torch.get_num_threads() if threads is None else threads
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        overhead = _overhead_seconds(device)
        table = {}
        for family in families or CALIBRATED:
            for row in (rows if BY_NAME[family].row_wise else (ROW,)):
                for dtype in dtypes:
                    points = []
                    for numel in (n for n in sizes if n >= row):
                        target, args, kwargs = _site_args(family, numel, dtype, device, row)
                        with torch.no_grad():
                            fused, ind = paired_medians([lambda: target(*args, **kwargs),
                                                         _inductor_fn(target, args, kwargs)], sync=sync_for(device))
                        ind = max(ind - overhead, 1e-9)
                        points.append([round(math.log2(numel), 3), round(ind / fused, 4), round(fused * 1e6, 3)])
                        if progress is not None:
                            progress(f"{family:14s} {str(dtype):15s} row {row:<5d} numel 2^{int(math.log2(numel)):<3d} "
                                     f"fused {fused * 1e6:9.2f} us  inductor {ind * 1e6:9.2f} us  "
                                     f"ratio {ind / fused:.2f}")
                    if points:
                        table.setdefault(family, {})[_row_key(dtype, row)] = points
    finally:
        torch.set_num_threads(old)
    return {_device_key(device): {str(threads): table}, "_overhead_us": {str(threads): overhead * 1e6}}


def save_calibration(result: dict, path: Optional[str] = None) -> str:
    """Merges a ``calibrate`` result into the calibration file (per device or CPU class, and thread count) and
    returns its path."""
    path = path or calibration_path()
    data = read_json(path, _checked_table) or {"version": TABLE_VERSION, "tables": {}, "meta": {}}
    for dev, per_threads in result.items():  # merged per family and dtype: a partial calibration keeps the rest
        if dev.startswith("_"):
            continue
        for threads, families in per_threads.items():
            table = data["tables"].setdefault(dev, {}).setdefault(threads, {})
            for family, per_dtype in families.items():
                table.setdefault(family, {}).update(per_dtype)
    meta = data.get("meta") if isinstance(data.get("meta"), dict) and "torch" not in data["meta"] else {}
    for dev in result:  # per table key (one CPU class each): what measured it
        if not dev.startswith("_"):
            meta[dev] = {"torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                         "overhead_us": result.get("_overhead_us")}
    data["meta"] = meta
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)
    cost_model(reload=True)
    return path
