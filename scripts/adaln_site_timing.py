"""Paired timings of one adaln (LayerNorm modulation) site: fusegraph's fused op, the code Inductor generates for
the same site (``choice._inductor_fn``, as ``bench calibrate`` times it) and a plain copy of x, at the calibration
row width (128) and at published widths, float32 and bf16, medians of interleaved runs.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/adaln_site_timing.py
"""
import torch

from fusegraph._core.measure import paired_medians
from fusegraph.fusion import choice

SITES = [(128, 32768), (3072, 1365), (3072, 320), (1536, 2730)]  # (D, rows): 2^22 elements, and FLUX.1/Wan widths


def main() -> None:
    torch.set_num_threads(1)
    op = torch.ops.fusegraph.adaln.default
    for d, rows in SITES:
        for dt in (torch.float32, torch.bfloat16):
            x, scale, shift = torch.randn(1, rows, d).to(dt), torch.randn(1, 1, d).to(dt), torch.randn(1, 1, d).to(dt)
            inductor = choice._inductor_fn(op, (x, scale, shift, 1e-6), {"norm": "layer"})
            fused, ind, copy = paired_medians([lambda: op(x, scale, shift, 1e-6, norm="layer"), inductor,
                                               lambda: x.clone()])
            print(f"D {d:5d} rows {rows:6d} {str(dt)[6:]:9s} fused {fused * 1e6:8.0f} us  inductor {ind * 1e6:8.0f} us"
                  f"  copy {copy * 1e6:8.0f} us  inductor/fused {ind / fused:5.2f}  fused/copy {fused / copy:5.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
