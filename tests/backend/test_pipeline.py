"""The compile as a pipeline (fusegraph/pipeline.py): ``compile_graph`` returns a record and reports to nothing;
``Backend`` absorbs the record; what Dynamo gets is the record's callable (an opt-in frozen compile: one
``FrozenGraph``, made inside the pipeline)."""
import torch
import torch.nn.functional as F

import fusegraph
from fusegraph import pipeline
from fusegraph.config import CompilationConfig
from fusegraph.freezing import FrozenGraph
from fusegraph.stats import Stats

ROUTES = {"inductor": {}, "aten": {"inductor": False}, "graph": {"graph_with_compile": True, "inductor": False}}


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        return F.gelu(self.proj(x), approximate="tanh")


def _dynamo_graph(model, x):
    """The FX graph and example inputs Dynamo hands a backend."""
    seen = []

    def grab(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=grab)(x)
    return seen[0]


def test_compile_graph_returns_a_record_and_reports_to_nothing():
    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(3, 16)
    gm, inputs = _dynamo_graph(model, x)
    for name, overrides in ROUTES.items():
        stats = Stats()
        with torch.no_grad():
            record = pipeline.compile_graph(CompilationConfig(**overrides), stats, gm, inputs, graph_id=7)
            out = record.fn(*inputs)
        out = out[0] if isinstance(out, (list, tuple)) else out
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
        assert record.graph_id == 7 and record.route in ("default", "graph_with_compile")
        assert record.job.counts["gelu"] == 1 and record.job.tally.patterns["gelu"] == 1, name
        assert stats.patterns["gelu"] == 0 and stats.fallbacks == {}, name  # the record is the caller's to absorb
        stats.absorb(record.job.tally)
        assert stats.patterns["gelu"] == 1, name


class _Recording(fusegraph.Backend):
    """A Backend that keeps what it hands Dynamo."""

    def __call__(self, gm, example_inputs):
        self.returned = super().__call__(gm, example_inputs)
        return self.returned


def test_what_dynamo_gets_is_the_record_callable(monkeypatch):
    records = []
    compile_graph = pipeline.compile_graph

    def recording(*args, **kwargs):
        records.append(compile_graph(*args, **kwargs))
        return records[-1]

    monkeypatch.setattr(pipeline, "compile_graph", recording)
    torch.manual_seed(1)
    model, x = _Block().eval(), torch.randn(3, 16)
    for overrides in ({"inductor": False}, {}, {"enable_freezing": True}):
        records.clear()
        torch._dynamo.reset()
        backend = _Recording(overrides)
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x), rtol=1e-5, atol=1e-5)
        (record,) = records
        compiled = backend.returned
        assert compiled is record.fn
        assert (type(compiled) is FrozenGraph) == ("enable_freezing" in overrides)
        assert backend.stats.patterns["gelu"] == 1 and backend.last_graph_ops == record.job.ops


def test_a_frozen_graph_compiles_unfrozen_through_the_pipeline_and_counts_into_the_stats(monkeypatch):
    """Another parameter tensor at a frozen position: FrozenGraph's one unfrozen compile goes through the pipeline
    (count=False: the sites are not counted twice; may_freeze=False), and is counted in the Backend's stats."""
    calls = []
    compile_graph = pipeline.compile_graph

    def recording(*args, **kwargs):
        calls.append((kwargs.get("count", True), kwargs.get("may_freeze", True)))
        return compile_graph(*args, **kwargs)

    monkeypatch.setattr(pipeline, "compile_graph", recording)
    torch.manual_seed(2)
    a, b, c, x = _Block().eval(), _Block().eval(), _Block().eval(), torch.randn(3, 16)
    torch._dynamo.reset()
    backend = fusegraph.Backend({"enable_freezing": True})
    with torch.no_grad():
        for m in (a, b, c, a, b):
            torch.testing.assert_close(torch.compile(m, backend=backend)(x), m(x), rtol=1e-5, atol=1e-5)
    assert calls == [(True, True), (False, False)]
    assert backend.stats.frozen_recompiles == 1 and backend.stats.patterns["gelu"] == 1
