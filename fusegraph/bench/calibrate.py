"""``python -m fusegraph bench calibrate [--threads N] [--dtypes fp32,bf16,fp16] [--rows 128,3072] [--out PATH]``

Measures the table the Inductor route's per-site choice reads (fusegraph.fusion.choice): for each pattern family,
dtype and size (1 Ki to 4 Mi elements), the fused op's time (called as Inductor's wrapper calls it) and the time of
the code Inductor generates for the same site (its lowering compiled with compile_fx, minus the per-call cost of a
compiled graph), in interleaved rounds. Writes it to the calibration file (Inductor's cache directory, per device
and thread count; ``--out`` to write elsewhere), which then takes precedence over the table shipped with the
package (fusegraph/fusion/cost_cpu.json, measured with this command on the development machine).
"""
from __future__ import annotations

import argparse
import sys

import torch

from .timing import machine_summary, setup_device

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main(argv=None) -> int:
    from fusegraph.fusion import choice

    p = argparse.ArgumentParser(prog="python -m fusegraph bench calibrate", description=__doc__.split("\n\n")[1])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for the measurement (the table is "
                   "kept per thread count; compiles use the nearest measured one)")
    p.add_argument("--dtypes", default="fp32,bf16,fp16")
    p.add_argument("--families", default=",".join(choice.CALIBRATED))
    p.add_argument("--sizes", default="10,13,16,19,22", help="log2 of the elements per site, comma-separated")
    p.add_argument("--rows", default=None, help="row widths the row-wise families (norms, modulations) are measured "
                   "at, comma-separated (default: the table's default width, 128; the published models' hidden "
                   "widths, e.g. 128,3072, let the choice judge a site by the width nearest its own)")
    p.add_argument("--out", default=None, help="the calibration file to write (default: the cache directory's)")
    args = p.parse_args(argv)
    try:
        sizes = tuple(sorted(2 ** int(k) for k in args.sizes.split(",")))
    except ValueError:
        p.error(f"--sizes: expected comma-separated integers (log2 of the elements per site), got {args.sizes!r}")
    if not sizes or min(sizes) < 2 ** 4 or max(sizes) > 2 ** 26:
        p.error(f"--sizes: each between 4 and 26 (16 to 64 Mi elements), got {args.sizes!r}")
    try:
        dtypes = tuple(DTYPES[d] for d in args.dtypes.split(","))
    except KeyError as e:
        p.error(f"--dtypes: unknown dtype {e.args[0]!r}; expected a comma-separated subset of {list(DTYPES)}")
    families = tuple(args.families.split(","))
    unknown = [f for f in families if f not in choice.CALIBRATED]
    if unknown:
        p.error(f"--families: unknown {unknown}; expected a comma-separated subset of {list(choice.CALIBRATED)}")
    try:
        rows = tuple(sorted({int(r) for r in args.rows.split(",")})) if args.rows else (choice.ROW,)
    except ValueError:
        p.error(f"--rows: expected comma-separated integers (row widths), got {args.rows!r}")
    if min(rows) < 1 or max(rows) > max(sizes):
        p.error(f"--rows: each between 1 and the largest size ({max(sizes)} elements), got {args.rows!r}")
    try:
        setup_device(args.device, args.threads)
    except ValueError as e:
        p.error(str(e))
    print(f"fusegraph bench calibrate: {machine_summary(args.device)}")
    result = choice.calibrate(args.device, dtypes, args.threads, sizes=sizes, families=families,
                              progress=lambda line: print(" ", line, flush=True), rows=rows)
    path = choice.save_calibration(result, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
