"""Adaptor for ``torch._inductor`` outside its pattern matcher (``torch_pattern_matcher``): compile_fx, the
decomposition table, the custom-pass interface, freezing's packing patterns, the code cache, its config, its
cache folder and the settings of torch.compile's modes."""
from __future__ import annotations

from .lazy import module_getattr

__getattr__ = module_getattr(__name__, {
    "compile_fx": ("torch._inductor.compile_fx", "compile_fx"),
    "compile_fx_inner": ("torch._inductor.compile_fx", "compile_fx_inner"),
    "select_decomp_table": ("torch._inductor.decomposition", "select_decomp_table"),
    "get_hash_for_files": ("torch._inductor.custom_graph_pass", "get_hash_for_files"),
    "cache_dir": ("torch._inductor.runtime.cache_dir_utils", "cache_dir"),
    "config": ("torch._inductor.config", None),
    "freezing_patterns": ("torch._inductor.fx_passes.freezing_patterns", None),
    "mkldnn_fusion": ("torch._inductor.fx_passes.mkldnn_fusion", None),
    "remove_noop_ops": ("torch._inductor.fx_passes.post_grad", "remove_noop_ops"),
    "PyCodeCache": ("torch._inductor.codecache", "PyCodeCache"),
    "list_mode_options": ("torch._inductor", "list_mode_options"),
    "aot_compile": ("torch._inductor", "aot_compile"),
    "aoti_compile_and_package": ("torch._inductor", "aoti_compile_and_package"),
    "load_package": ("torch._inductor", "aoti_load_package"),
    "AOTIModelPackageLoader": ("torch._C._aoti", "AOTIModelPackageLoader"),
    "package_pt2": ("torch.export.pt2_archive._package", "package_pt2"),
    "pick_vec_isa": ("torch._inductor.cpu_vec_isa", "pick_vec_isa"),
})


def custom_graph_pass_base() -> type:
    """The base class of a post-grad custom pass: ``CustomInferenceAwareGraphPass`` (its ``__call__`` is told whether
    the graph is an inference graph) where this torch has it, else ``CustomGraphPass``."""
    try:
        from torch._inductor.custom_graph_pass import CustomInferenceAwareGraphPass as base
    except ImportError:  # pragma: no cover - older torch
        from torch._inductor.custom_graph_pass import CustomGraphPass as base
    return base
