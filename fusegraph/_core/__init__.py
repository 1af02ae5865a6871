"""The bottom layer: what every other layer may use and which uses none of them.

- ``torch_*.py``: the adaptors, one per torch subsystem — the only modules that name torch's private API
  (``torch._dynamo``, ``torch._inductor``, its pattern matcher, fake tensors, ``torch._C``/``torch._ops``,
  ``torch.utils._pytree``, ``torch.distributed``'s private helpers). A torch upgrade has these files to check;
  tests/test_layers.py fails on a private name used anywhere else.
- ``cache.py``: fusegraph's files next to Inductor's cache (one folder), read so that no file can fail a compile,
  and the verdicts measured once and kept there.
- ``measure.py``: the one timing policy (paired, interleaved medians) and device synchronisation.
- ``ranks.py``: agreement between the ranks of a torch.distributed job (collectives in a graph, signatures).
"""
