"""Tiny diffusers pipelines built offline, the way diffusers' own pipeline tests build theirs: the zoo's tiny
transformer (random weights, fusegraph.zoo), a tiny VAE built from a config, the pipeline's usual scheduler, no
text encoders — the prompts are given as embeddings (``prompt_embeds`` & co., seeded random), so nothing is
downloaded. ``PIPELINES[name]()`` returns a ``Tiny``: the pipeline and the keyword arguments of one call."""
from __future__ import annotations

import dataclasses

import torch

from fusegraph import zoo


@dataclasses.dataclass
class Tiny:
    pipe: object
    kwargs: dict           # one call's arguments, without the generator
    steps: int = 4

    @property
    def transformer(self):
        return self.pipe.transformer

    @torch.no_grad()
    def __call__(self, **overrides) -> torch.Tensor:
        """The decoded image (video frames for Wan) of one full denoising loop, seeded: [0, 1] floats."""
        kwargs = dict(self.kwargs, num_inference_steps=self.steps, output_type="pt",
                      generator=torch.Generator().manual_seed(0))
        kwargs.update(overrides)
        out = self.pipe(**kwargs)
        return out.frames if hasattr(out, "frames") else out.images


def _quiet():
    import diffusers

    diffusers.utils.logging.set_verbosity_error()
    return diffusers


def _embeddings(seed: int, **shapes) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def _image_vae(latent_channels: int):
    """A one-level AutoencoderKL (vae_scale_factor 1): decoding costs next to nothing."""
    diffusers = _quiet()
    torch.manual_seed(1)
    return diffusers.AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,),
                                   layers_per_block=1, latent_channels=latent_channels, norm_num_groups=1,
                                   use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609,
                                   scaling_factor=1.5035).eval()


def flux(seed: int = 0) -> Tiny:
    """FluxPipeline: the zoo's 2+2-block FluxTransformer2DModel (in_channels 4: 1 latent channel in 2x2 patches),
    16x16 images (64 image tokens), 8 text tokens, FlowMatchEulerDiscreteScheduler."""
    diffusers = _quiet()
    transformer, _ = zoo.build("FluxTransformer2DModel", seed=seed)
    pipe = diffusers.FluxPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=_image_vae(1),
                                  text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
                                  transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    kwargs = dict(_embeddings(seed + 1, prompt_embeds=(1, 8, 32), pooled_prompt_embeds=(1, 32)),
                  height=16, width=16, guidance_scale=3.5, max_sequence_length=8)
    return Tiny(pipe, kwargs)


def sd3(seed: int = 0) -> Tiny:
    """StableDiffusion3Pipeline: the zoo's SD3Transformer2DModel (one dual-attention layer), 8x8 latents, 7 text
    tokens, classifier-free guidance (batch 2: negative embeddings given), FlowMatchEulerDiscreteScheduler."""
    diffusers = _quiet()
    transformer, _ = zoo.build("SD3Transformer2DModel", seed=seed)
    pipe = diffusers.StableDiffusion3Pipeline(
        transformer=transformer, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=_image_vae(4),
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None, text_encoder_3=None,
        tokenizer_3=None)
    pipe.set_progress_bar_config(disable=True)
    kwargs = dict(_embeddings(seed + 1, prompt_embeds=(1, 7, 32), pooled_prompt_embeds=(1, 64),
                              negative_prompt_embeds=(1, 7, 32), negative_pooled_prompt_embeds=(1, 64)),
                  height=8, width=8, guidance_scale=5.0)
    return Tiny(pipe, kwargs)


def wan(seed: int = 0) -> Tiny:
    """WanPipeline: the zoo's 2-block WanTransformer3DModel, a tiny AutoencoderKLWan (4 latent channels, 4x
    temporal compression), 5 frames of 16x16, classifier-free guidance, UniPCMultistepScheduler with flow sigmas
    (Wan 2.1's)."""
    diffusers = _quiet()
    transformer, _ = zoo.build("WanTransformer3DModel", seed=seed)
    torch.manual_seed(1)
    vae = diffusers.AutoencoderKLWan(base_dim=3, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                     temperal_downsample=[False, True, True], latents_mean=[0.1, -0.2, 0.05, 0.0],
                                     latents_std=[1.5, 2.0, 1.0, 2.5]).eval()
    scheduler = diffusers.UniPCMultistepScheduler(flow_shift=3.0, prediction_type="flow_prediction",
                                                  use_flow_sigmas=True)
    pipe = diffusers.WanPipeline(tokenizer=None, text_encoder=None, transformer=transformer, vae=vae,
                                 scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    kwargs = dict(_embeddings(seed + 1, prompt_embeds=(1, 12, 16), negative_prompt_embeds=(1, 12, 16)),
                  height=16, width=16, num_frames=5, guidance_scale=5.0)
    return Tiny(pipe, kwargs)


PIPELINES = {"flux": flux, "sd3": sd3, "wan": wan}
