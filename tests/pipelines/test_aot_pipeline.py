"""A whole tiny FluxPipeline whose transformer runs from a fused AOTInductor package (fusegraph.aot), made from the
transformer called as the pipeline calls it: the decoded image equals the eager pipeline's (fp32, 1e-4)."""
import torch

from fusegraph import aot
from tests.pipelines.tiny import PIPELINES


def test_flux_pipeline_runs_its_transformer_from_a_package(tmp_path):
    tiny = PIPELINES["flux"]()
    want = tiny()
    seen = []
    hook = tiny.transformer.register_forward_pre_hook(lambda m, args, kwargs: seen.append((args, kwargs)),
                                                      with_kwargs=True)
    tiny()
    hook.remove()
    assert len(seen) == tiny.steps
    args, kwargs = seen[0]
    path = aot.package(tiny.transformer, args, kwargs, str(tmp_path / "flux.pt2"), config={"fusion_choice": "always"})
    loaded = aot.load(path)
    assert sum(loaded.counts.values()) > 0 and loaded.metadata["fusegraph.ops"]
    loaded.serve(tiny.transformer)
    got = tiny()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    other = tiny(prompt_embeds=tiny.kwargs["prompt_embeds"] + 0.5)  # the package reads the prompt
    assert (other - want).abs().max() > 1e-3
