"""Weight packing under freezing, decided per site by measurement.

Freezing lets Inductor replace a convolution with oneDNN's packed form (``mkldnn._convolution_pointwise`` on a
weight reordered once, activations in channels-last). That wins on large convolutions and loses on small ones:
the packed call costs more per call, and the layout change costs copies. On the tiny diffusers models of the zoo
(one patch-embedding conv, or Sana's GLUMBConv) packing made the frozen compile 20-40 us per call slower than
plain ``torch.compile``, which does not freeze and never packs. So a convolution is packed only where packing is
measured faster: both forms are timed once for the site's shapes, dtype, thread count and CPU (interleaved
medians, ~50 ms per new signature), and the verdict is cached in memory and on disk next to Inductor's cache,
the way Inductor's autotuning times its choices once. ``decisions()`` lists what was decided in this process.

Linears are decided by the CPU class's measured GEMM table instead (``freezing._packs_linear``; float32 packed for
oneDNN only where the table says so, bf16/fp16 unless the class widens them); ``freezing.packing_policy`` is where
both checks are wired in.
"""
from __future__ import annotations

import collections
import logging
import threading

import torch

from ._core import measure
from ._core import cache
from ._core.cache import VerdictFile, is_timed_verdict

log = logging.getLogger("fusegraph")

# Pack where t(plain) / t(packed, with its layout change) is at least this (the choice's margin elsewhere too).
MARGIN = 1.05
CACHE_VERSION = 1

_lock = threading.Lock()
_decided = collections.deque(maxlen=1024)  # (signature, pack?, t_plain, t_packed), the latest checks first out


def cache_path() -> str:
    return cache.path("packing", f"conv_v{CACHE_VERSION}.json")


_verdicts = VerdictFile(lambda: cache_path(),  # key -> [pack?, t_plain, t_packed]
                        valid=lambda v: is_timed_verdict(v, (True, False)))


def decisions() -> list:
    """The packing verdicts this process applied, oldest first (the last 1024 checks; Inductor's matcher may check a
    site more than once): (signature, packed?, t_plain, t_packed)."""
    with _lock:
        return list(_decided)


def _shape(val) -> tuple | None:
    try:
        return tuple(int(s) for s in val.shape)
    except (TypeError, ValueError):  # a symbolic size: no static signature to time
        return None


def conv_signature(node: torch.fx.Node) -> tuple | None:
    """What the timing depends on, for an ``aten.convolution`` node: None when it cannot be timed."""
    x, w, b = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[:3])
    if x is None or w is None or x.device.type != "cpu":
        return None
    xs, ws = _shape(x), _shape(w)
    if xs is None or ws is None:
        return None
    stride, padding, dilation, transposed, output_padding, groups = node.args[3:9]
    return (str(x.dtype).replace("torch.", ""), xs, ws, b is not None, tuple(stride), tuple(padding),
            tuple(dilation), bool(transposed), tuple(output_padding), int(groups))


def _key(sig: tuple) -> str:
    return "|".join([torch.__version__, torch.backends.cpu.get_cpu_capability(), f"t{torch.get_num_threads()}",
                     repr(sig)])


def _forms(sig: tuple) -> tuple:
    """(plain, packed): the plain convolution and the packed one, including the input's change to channels-last
    (Inductor may fold that change into a producer, or not: counted, to stay on the safe side), on random inputs of
    the signature's shapes."""
    dtype, xs, ws, has_bias, stride, padding, dilation, transposed, output_padding, groups = sig
    dtype = getattr(torch, dtype)
    x = torch.randn(xs, dtype=dtype)
    w = torch.randn(ws, dtype=dtype)
    b = torch.randn(ws[1] * groups if transposed else ws[0], dtype=dtype) if has_bias else None
    mkldnn = torch.ops.mkldnn
    fmt = torch.channels_last if len(xs) == 4 else torch.channels_last_3d
    if transposed:
        packed_w = mkldnn._reorder_convolution_transpose_weight(w, list(padding), list(output_padding),
                                                                 list(stride), list(dilation), groups, list(xs))

        def packed():
            return mkldnn._convolution_transpose_pointwise(x.contiguous(memory_format=fmt), packed_w, b,
                                                           list(padding), list(output_padding), list(stride),
                                                           list(dilation), groups, "none", [], "")
    else:
        packed_w = mkldnn._reorder_convolution_weight(w, list(padding), list(stride), list(dilation), groups,
                                                      list(xs))

        def packed():
            return mkldnn._convolution_pointwise(x.contiguous(memory_format=fmt), packed_w, b, list(padding),
                                                 list(stride), list(dilation), groups, "none", [], "")

    def plain():
        return torch.ops.aten.convolution.default(x, w, b, list(stride), list(padding), list(dilation), transposed,
                                                  list(output_padding), groups)

    return plain, packed


def conv_packing_pays(node: torch.fx.Node) -> bool:
    """Whether packing this convolution is measured faster (cached per signature); False when it cannot be
    measured (a symbolic shape, a failure: the plain convolution is what plain torch.compile runs too)."""
    sig = conv_signature(node)
    if sig is None:
        return False
    key = _key(sig)
    with _lock:
        verdict = _verdicts.get(key)
        if verdict is None:
            from ._core.torch_fake import unset_fake_temporarily

            try:
                with unset_fake_temporarily(), torch.no_grad():
                    plain, packed = _forms(sig)
                    verdict = measure.decide(plain, packed, by=MARGIN, store=_verdicts, key=key, min_time=0.025,
                                             rounds=7)
            except Exception as e:  # an op this build lacks, a shape oneDNN refuses: leave it plain
                log.info("fusegraph: conv %s not timed (%s: %s); left unpacked", sig, type(e).__name__, e)
                return False
            log.info("fusegraph: conv %s: plain %.1f us, packed %.1f us: %s", sig, verdict[1] * 1e6,
                     verdict[2] * 1e6, "packed" if verdict[0] else "left unpacked")
        _decided.append((sig, bool(verdict[0]), verdict[1], verdict[2]))
        return bool(verdict[0])
