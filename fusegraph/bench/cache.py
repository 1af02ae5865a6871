"""``python -m fusegraph bench cache [--widths tiny|flux] [--cache dbcache|fbc] [--steps N] [--threshold T]
[--tokens IMG,TXT] [--layers N] [--variants A,B,...] [--rounds N] [--threads N] [--json PATH]``

Step caching times compilation, end to end: a whole FluxPipeline call (the denoising loop and the decode), with the
transformer eager, cached, compiled, and cached and compiled, in one process. The step cache is cache-dit's DBCache
(``cache_dit.enable_cache``, an optional benchmark dependency: ``pip install cache-dit``; Fn_compute_blocks=1,
Bn_compute_blocks=1 where the transformer has 2 + 2 blocks or more, else 0, max_warmup_steps=2) or diffusers' First
Block Cache (``transformer.enable_cache(FirstBlockCacheConfig)``). Variants: ``eager``, ``cache`` (the cache alone),
``compile`` and ``compile_graph`` (fusegraph's default and graph routes alone), ``cache+compile`` and
``cache+compile_graph`` (``--variants`` picks some; ``eager`` and ``cache`` are always run: the references).

The pipeline is built offline with random weights, no text encoders (seeded prompt embeddings) and a one-level VAE
that costs next to nothing: ``--widths tiny`` is the tiny FluxTransformer2DModel of fusegraph.zoo (2 + 2 blocks,
hidden 32) at 16x16 pixels (64 image tokens) and 8 text tokens; ``--widths flux`` the FLUX.1-dev widths of ``bench
real`` (hidden 3072, text 4096, pooled 768, guidance embedding) with ``--layers`` blocks of each kind (default 1)
and ``--tokens`` image and text tokens (default 256,64: a 32x32 latent; image tokens are rounded to a square).

Two transformers with the same weights: one plain (eager, compile, compile_graph), one the cache is enabled on (its
pipeline's call refreshes the cache's state). Each variant's first call is its compile (timed); one more call
warms it; then ``--rounds`` rounds call every variant once, the order rotated by one each round, so that a change of
the machine's load hits all alike. Reported per variant: transformer calls that ran their remaining blocks and
that skipped them (the cache's own record), first call, median end-to-end time, speed-up over eager, over the cache
alone and over the compile alone, and the max |diff| of its image against its reference (``cache+compile*``
against ``cache``, ``compile*`` and ``cache`` against ``eager``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

VARIANTS = ("eager", "cache", "compile", "compile_graph", "cache+compile", "cache+compile_graph")
ROUTES = {"compile": {}, "compile_graph": {"graph_with_compile": True}}


def _transformer(widths: str, layers: int, img: int, txt: int):
    """(FluxTransformer2DModel with seeded random weights, pipeline call kwargs without steps, widths summary)."""
    import diffusers
    import torch

    from .. import zoo
    from . import real

    diffusers.utils.logging.set_verbosity_error()
    if widths == "tiny":
        model, _ = zoo.build("FluxTransformer2DModel", seed=0)
        side, txt, summary = 16, 8, "tiny Flux (fusegraph.zoo): hidden 32 = 2 x 16, 2 + 2 blocks"
    else:
        _, init, _, summary = real.MODELS["flux"](layers, img, txt, torch.Generator())
        torch.manual_seed(0)
        model = zoo.randomize_weights(diffusers.FluxTransformer2DModel(**init), 0).eval()
        side = 2 * max(1, round(img ** 0.5))
        summary += f", {layers} + {layers} blocks"
    cfg = model.config
    g = torch.Generator().manual_seed(1)
    kwargs = dict(prompt_embeds=torch.randn(1, txt, cfg.joint_attention_dim, generator=g),
                  pooled_prompt_embeds=torch.randn(1, cfg.pooled_projection_dim, generator=g),
                  height=side, width=side, guidance_scale=3.5, max_sequence_length=txt)
    summary += f"; {side}x{side} pixels = {(side // 2) ** 2} image tokens, {txt} text tokens"
    return model.eval(), kwargs, summary


def _pipeline(transformer):
    import diffusers
    import torch

    latent = transformer.config.in_channels // 4
    torch.manual_seed(1)
    vae = diffusers.AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,),
                                  layers_per_block=1, latent_channels=latent, norm_num_groups=1, use_quant_conv=False,
                                  use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035).eval()
    pipe = diffusers.FluxPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None,
                                  tokenizer=None, text_encoder_2=None, tokenizer_2=None, transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe


class _Skips:
    """How many transformer calls of the last pipeline call skipped their remaining blocks, and how many decided."""

    def __init__(self, cache: str, pipe, threshold: float, blocks: int):
        self.cache, self.pipe = cache, pipe
        if cache == "dbcache":
            import cache_dit

            config = cache_dit.DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=1 if blocks >= 4 else 0,
                                             max_warmup_steps=2, residual_diff_threshold=threshold)
            cache_dit.enable_cache(pipe, cache_config=config)
        else:
            import diffusers
            import torch
            from diffusers.hooks import first_block_cache

            decide = first_block_cache.FBCHeadBlockHook._should_compute_remaining_blocks
            self.calls = calls = []

            @torch.compiler.disable
            def recording(hook, residual):  # the hook keeps no record of its decisions
                compute = decide(hook, residual)
                calls.append(not compute)
                return compute

            first_block_cache.FBCHeadBlockHook._should_compute_remaining_blocks = recording
            self.close = lambda: setattr(first_block_cache.FBCHeadBlockHook, "_should_compute_remaining_blocks",
                                         decide)
            pipe.transformer.enable_cache(diffusers.FirstBlockCacheConfig(threshold=threshold))

    def close(self):
        """Undoes what the recording changed outside the pipeline (First Block Cache's decision method)."""

    def read(self) -> tuple[int, int]:
        """(skipped, transformer calls) of the last pipeline call."""
        if self.cache == "dbcache":
            import cache_dit

            stats = cache_dit.summary(self.pipe, logging=False)[0]
            return len(stats.cached_steps) + len(stats.cfg_cached_steps), stats.accumulated_transformer_executed_steps
        out = (sum(self.calls), len(self.calls))
        self.calls.clear()
        return out


def run(widths: str, cache: str, steps: int, threshold: float, layers: int, img: int, txt: int,
        rounds: int, variants=VARIANTS) -> dict:
    import torch

    import fusegraph

    from .._core.torch_dynamo import recompile_limit
    from .timing import interleaved_seconds

    variants = [v for v in VARIANTS if v in ("eager", "cache") or v in variants]
    transformer, kwargs, summary = _transformer(widths, layers, img, txt)
    cached_transformer, _, _ = _transformer(widths, layers, img, txt)
    plain, cached = _pipeline(transformer), _pipeline(cached_transformer)
    blocks = len(transformer.transformer_blocks) + len(transformer.single_transformer_blocks)
    skips = _Skips(cache, cached, threshold, blocks)
    backends = {}
    runners = {}
    for variant in variants:
        pipe = cached if variant.startswith("cache") else plain
        module = pipe.transformer
        route = variant.removeprefix("cache+") if "compile" in variant else None
        if route is not None:
            backends[variant] = fusegraph.Backend(fusegraph.CompilationConfig(**ROUTES[route]))
            module = torch.compile(module, backend=backends[variant])
        runners[variant] = (pipe, module)

    def call(variant):
        pipe, module = runners[variant]
        pipe.transformer = module
        out = pipe(**kwargs, num_inference_steps=steps, output_type="pt",
                   generator=torch.Generator().manual_seed(0)).images
        return out, (skips.read() if variant.startswith("cache") else (0, steps))

    def timed(variant):
        _, skipped = call(variant)
        assert skipped[0] == rows[variant]["skipped"], (variant, skipped, rows[variant]["skipped"])

    rows = {}
    # two backends on one module, and the caches' state, compile some frames more often than Dynamo's default 8
    try:
        with torch.no_grad(), recompile_limit(64):
            for variant in variants:
                t0 = time.perf_counter()
                image, skipped = call(variant)
                first = time.perf_counter() - t0
                call(variant)
                b = backends.get(variant)
                compiled = {} if b is None else dict(graphs_compiled=b.stats.graphs_compiled,
                                                     graphs_captured=b.stats.graphs_captured)
                rows[variant] = dict(first_s=first, image=image, skipped=skipped[0], calls=skipped[1],
                                     compiled=compiled)
            times = interleaved_seconds({v: (lambda v=v: timed(v)) for v in variants}, warmup=0, reps=rounds)
    finally:
        skips.close()
    for variant in variants:
        rows[variant]["times_s"] = times[variant]
    for variant, row in rows.items():
        b = backends.get(variant)
        if b is not None:  # the timed calls compiled and captured nothing
            row["recompiled"] = {k: getattr(b.stats, k) - v for k, v in row["compiled"].items()}
        ref = "cache" if variant.startswith("cache+") else "eager"
        row["max_diff"] = float((row["image"] - rows[ref]["image"]).abs().max()) if variant != "eager" else 0.0
        row["median_s"] = statistics.median(row["times_s"])
    for row in rows.values():
        del row["image"]
    return dict(summary=summary, widths=widths, cache=cache, steps=steps, threshold=threshold, rows=rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusegraph bench cache", description=__doc__.split("\n\n")[1])
    p.add_argument("--widths", choices=("tiny", "flux"), default="tiny")
    p.add_argument("--cache", choices=("dbcache", "fbc"), default="dbcache")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threshold", type=float, default=None,
                   help="the cache's threshold (default: 0.4 for dbcache, 0.5 for fbc)")
    p.add_argument("--tokens", default="256,64", help="--widths flux: image and text tokens (default 256,64)")
    p.add_argument("--layers", type=int, default=1, help="--widths flux: blocks of each kind (default 1)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="','-separated (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    try:
        img, txt = (int(v) for v in args.tokens.split(","))
    except ValueError:
        p.error(f"argument --tokens: expected IMG,TXT (two integers), got {args.tokens!r}")
    if min(img, txt, args.layers, args.rounds, args.threads, args.steps) < 1:
        p.error("argument --tokens/--layers/--rounds/--threads/--steps: expected positive integers")
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"argument --variants: unknown {', '.join(unknown)} (choose from {', '.join(VARIANTS)})")
    if args.cache == "dbcache":
        try:
            import cache_dit  # noqa: F401
        except ImportError:
            print("bench cache: cache-dit is not installed (optional: pip install cache-dit)")
            return 1
    threshold = args.threshold if args.threshold is not None else {"dbcache": 0.4, "fbc": 0.5}[args.cache]
    import torch

    from .timing import machine_summary

    torch.set_num_threads(args.threads)
    result = run(args.widths, args.cache, args.steps, threshold, args.layers, img, txt, args.rounds, variants)
    rows = result["rows"]
    print(f"{result['summary']}; {args.cache}, threshold {threshold}, {args.steps} steps, fp32; {machine_summary()}")
    print(f"{'variant':20s} {'skipped':>9s} {'first call':>11s} {'median':>10s} {'vs eager':>9s} {'vs cache':>9s} "
          f"{'vs compile':>11s} {'max|diff|':>10s}")
    for variant, row in rows.items():
        compile_ref = rows.get("compile_graph" if variant.endswith("graph") else "compile")
        vs = [rows["eager"]["median_s"] / row["median_s"], rows["cache"]["median_s"] / row["median_s"]]
        vs_compile = f"{compile_ref['median_s'] / row['median_s']:10.2f}x" if compile_ref else f"{'-':>11s}"
        print(f"{variant:20s} {row['skipped']:>4d} / {row['calls']:<2d} {row['first_s']:9.1f} s "
              f"{row['median_s'] * 1e3:8.1f} ms {vs[0]:8.2f}x {vs[1]:8.2f}x {vs_compile} {row['max_diff']:10.2e}"
              + (f"  (timed calls compiled {row['recompiled']})" if any(row.get("recompiled", {}).values()) else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(result, machine=machine_summary(), threads=args.threads, rounds=args.rounds), f, indent=1)
    return 0
