"""Which kernel OpenVINO's CPU plugin runs a float32 linear with, and how fast, at the published models' shapes:
one ``torch.nn.Linear`` converted and compiled (``INFERENCE_PRECISION_HINT=f32``, 1 thread), its FullyConnected
node's ``primitiveType`` read from the runtime model, warm mean of 5 calls. Run it plain and under a class's caps:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/openvino_fc_kernels.py
    OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 \\
        MKL_ENABLE_INSTRUCTIONS=AVX2 .venv/bin/python scripts/openvino_fc_kernels.py

(docs/BENCHMARKS.md §1.3: OpenVINO's MLAS GEMM picks its code by CPUID, so no cap emulates a narrower class for it.)
"""
import time

import openvino as ov
import torch

SHAPES = ((320, 3072, 12288), (320, 12288, 3072), (256, 1536, 8960), (64, 4096, 1536))


def main() -> None:
    for rows, k, n in SHAPES:
        model = torch.nn.Linear(k, n).eval()
        x = torch.randn(rows, k)
        compiled = ov.Core().compile_model(ov.convert_model(model, example_input=x), "CPU",
                                           {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"})
        compiled([x.numpy()])
        t = time.perf_counter()
        for _ in range(5):
            compiled([x.numpy()])
        seconds = (time.perf_counter() - t) / 5
        kinds = [op.get_rt_info()["primitiveType"].astype(str) for op in compiled.get_runtime_model().get_ops()
                 if op.get_rt_info()["layerType"].astype(str) == "FullyConnected"]
        print(f"{rows} x {k} x {n}: {kinds} {seconds * 1e3:.1f} ms, {2 * rows * k * n / seconds / 1e9:.0f} GFLOP/s",
              flush=True)


if __name__ == "__main__":
    main()
