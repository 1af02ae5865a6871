"""Batch dispatch: capture a function once per input signature into a device graph and replay it.

``GraphRunner(fn, config=None)`` for any callable of tensors; ``compile_graph_route`` for the backend's
graph routes. Drivers: CUDA graph, Ascend NPUGraph (torch.npu), and the C++ host graph on CPU.
"""
from .drivers import cuda_graph_available, device_graph_available, npu_graph_available, select_driver
from .host import build_host_graph, trace_aten
from .options import GraphOptions
from .runner import GraphRunner, compile_graph_route

__all__ = ["GraphRunner", "compile_graph_route", "GraphOptions", "build_host_graph", "trace_aten",
           "cuda_graph_available", "device_graph_available", "npu_graph_available", "select_driver"]
