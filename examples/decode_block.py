"""The seed's decode-block example, portable: RMSNorm -> QKV -> RoPE -> attention over a static KV cache ->
out-projection -> residual, run eagerly and through fusegraph's graph runtime (a CUDA graph on CUDA, the
C++ host graph on CPU, an NPUGraph on Ascend through torch.npu).

    python examples/decode_block.py            # checks, then the three timing figures (from a checkout:
                                               # PYTHONPATH=. python examples/decode_block.py)
"""
import sys

import torch

import fusegraph
from fusegraph.bench import decode

if __name__ == "__main__":
    device = "cuda" if torch.cuda.is_available() else "cpu"
    block = decode.DecodeBlock(hidden=512, heads=8, cache_len=128, batch=1, dtype=torch.bfloat16, device=device)
    x, cos, sin = decode.make_inputs(block, batch=1, position=128, dtype=torch.bfloat16, device=device)
    runner = fusegraph.graph.GraphRunner(block)
    with torch.no_grad():
        out = runner(x, cos, sin)
        torch.testing.assert_close(out.double(), decode.reference(block, x, cos, sin), rtol=1e-2, atol=1e-2)
        assert torch.equal(out, block(x, cos, sin)), "graph and no-graph results differ"
    print("Kernel Output Match!")
    print(runner.stats)
    sys.exit(decode.main(["--device", device, "--no-compile"] + sys.argv[1:]))
