"""Which kernel OpenVINO's CPU plugin runs a float32 linear with, and how fast against torch's own float32 GEMMs at
the published models' shapes, side by side: one ``torch.nn.Linear`` converted and compiled
(``INFERENCE_PRECISION_HINT=f32``, 1 thread; its FullyConnected node's ``primitiveType`` read from the runtime
model) and, in the same process, MKL's ``addmm`` (what eager and Inductor run), ``fusegraph.linear`` (oneDNN on the
plain weight, the Intel default) and oneDNN on a weight packed once (``pack_weights=True``'s copy). Each round
calls every kernel once in turn (the same weight each call, as OpenVINO holds its own); medians over the rounds,
GFLOP/s, and each kernel's time over MKL's. Run it plain and under a class's caps:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/openvino_fc_kernels.py [--rounds 9]
    OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 \\
        MKL_ENABLE_INSTRUCTIONS=AVX2 .venv/bin/python scripts/openvino_fc_kernels.py

(docs/BENCHMARKS.md §1.3: OpenVINO's MLAS GEMM picks its code by CPUID, so no cap emulates a narrower class for
it; and rates taken in separate runs are not comparable on a shared machine whose speed moves — only these
interleaved ones are.)
"""
import argparse
import statistics
import time

import openvino as ov
import torch

import fusegraph  # noqa: F401  (registers fusegraph.linear)

SHAPES = ((320, 3072, 3072), (320, 3072, 12288), (320, 12288, 3072), (256, 1536, 8960), (256, 8960, 1536),
          (64, 4096, 1536))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    core = ov.Core()
    for rows, k, n in SHAPES:
        model = torch.nn.Linear(k, n).eval()
        x = torch.randn(rows, k, generator=g)
        w, b = model.weight.detach(), model.bias.detach()
        compiled = core.compile_model(ov.convert_model(model, example_input=x), "CPU",
                                      {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"})
        request, xn = compiled.create_infer_request(), x.numpy()
        request.infer({0: xn})  # the node's primitive is chosen at the first inference ("undef" before)
        kinds = [op.get_rt_info()["primitiveType"].astype(str) for op in compiled.get_runtime_model().get_ops()
                 if op.get_rt_info()["layerType"].astype(str) == "FullyConnected"]
        packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
        fns = {"mkl": lambda: torch.addmm(b, x, w.t()),
               "onednn": lambda: torch.ops.fusegraph.linear(x, w, b),
               "onednn_packed": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], ""),
               "openvino": lambda: request.infer({0: xn}, share_inputs=True)}
        ref = fns["mkl"]()
        for name, got in (("openvino", torch.from_numpy(next(iter(request.infer({0: xn}).values())).copy())),
                          ("onednn", fns["onednn"]()), ("onednn_packed", fns["onednn_packed"]())):
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-3, msg=lambda m: f"{name}: {m}")
        for fn in fns.values():
            fn()
        times = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        med = {name: statistics.median(v) for name, v in times.items()}
        gflop = 2 * rows * k * n / 1e9
        print(f"{rows} x {k} x {n} (OpenVINO: {kinds}): " + "  ".join(
            f"{name} {t * 1e3:.1f} ms {gflop / t:.0f} GFLOP/s ({med['mkl'] / t:.2f}x)" for name, t in med.items()),
            flush=True)


if __name__ == "__main__":
    main()
