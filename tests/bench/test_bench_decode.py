"""`python -m fusegraph bench decode` runs its checks and prints the three figures (tiny sizes here)."""
import torch

from fusegraph.bench import decode


def test_bench_decode_smoke(capsys):
    threads = torch.get_num_threads()
    assert decode.main(["--hidden", "64", "--heads", "2", "--cache-len", "8", "--reps", "3", "--no-compile"]) == 0
    assert torch.get_num_threads() == threads
    out = capsys.readouterr().out
    assert "graph == no-graph (the same fused ops uncaptured): True" in out
    assert "overhead per replayed op" in out
    assert "fusegraph graph route (host graph" in out


def test_decode_block_matches_its_float64_reference_in_bf16():
    block = decode.DecodeBlock(hidden=128, heads=4, cache_len=16, batch=2)
    x, cos, sin = decode.make_inputs(block, 2, position=16, dtype=torch.bfloat16)
    with torch.no_grad():
        out = block(x, cos, sin)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), decode.reference(block, x, cos, sin), rtol=1e-2, atol=1e-2)
