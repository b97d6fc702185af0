"""How vision-language models are stored in Hugging Face checkpoints: the
vision towers' parameters (`maxtext.layers.vision`) and the multimodal
`config.json` around a text decoder's (`maxtext.models.hf_params` holds the
`ParamMap` these entries are).
"""

from typing import Any

from maxtext.common.model_config import ModelConfig
from maxtext.models.hf_params import ParamMap


def multimodal_hf_config(cfg: ModelConfig, text: dict[str, Any], *,
                         model_type: str, architecture: str,
                         vision_config: dict[str, Any],
                         token_keys: dict[str, str]) -> dict[str, Any]:
  """A vision-language `config.json` (transformers'
  `*ForConditionalGeneration`) of `cfg`: its text decoder's config `text`
  as `text_config`, `vision_config`, and the image token ids (`token_keys`:
  our `model` key -> the config's)."""
  values = cfg.to_dict()
  return {
      "model_type": model_type, "architectures": [architecture],
      "text_config": {key: value for key, value in text.items()
                      if key != "architectures"},
      "vision_config": vision_config,
      **{key: values[ours] for ours, key in token_keys.items()},
      "tie_word_embeddings": cfg.tie_embeddings, "dtype": text.get("dtype"),
  }


# SigLIP vision tower (`maxtext.layers.vision.VisionEncoder` at `vision`) as
# transformers' (>= 5) `SiglipVisionModel` inside a multimodal model (earlier
# checkpoints' `vision_tower.vision_model.*` are renamed on load).
SIGLIP_PREFIX = "model.vision_tower."
SIGLIP_PARAMS = (
    ParamMap(("vision", "patch_embedding", "kernel"),
             SIGLIP_PREFIX + "embeddings.patch_embedding.weight",
             permuted=(3, 2, 0, 1)),
    ParamMap(("vision", "patch_embedding", "bias"),
             SIGLIP_PREFIX + "embeddings.patch_embedding.bias"),
    ParamMap(("vision", "position_embedding"),
             SIGLIP_PREFIX + "embeddings.position_embedding.weight"),
    ParamMap(("vision", "post_norm", "scale"),
             SIGLIP_PREFIX + "post_layernorm.weight"),
    ParamMap(("vision", "post_norm", "bias"),
             SIGLIP_PREFIX + "post_layernorm.bias"),
)


def vision_layer_params(prefix: str, norms: tuple[str, str],
                        output: str) -> tuple[ParamMap, ...]:
  """Per encoder layer of a vision tower (paths inside a
  `vision.EncoderLayer`), Hugging Face names `prefix` + "{layer}." + ...:
  its two LayerNorms `norms` (before attention, before the MLP), q/k/v and
  `output` projections under self_attn, fc1/fc2 under mlp, all with
  biases."""
  def layer(ours, hf, **layout):
    return ParamMap(ours, prefix + "{layer}." + hf, **layout)

  return tuple(
      layer((norm, field), f"{hf}.{hf_field}")
      for norm, hf in zip(("pre_attention_norm", "pre_mlp_norm"), norms)
      for field, hf_field in (("scale", "weight"), ("bias", "bias"))) + tuple(
          entry
          for ours, hf, in_ndim in (("query", "self_attn.q_proj", 1),
                                    ("key", "self_attn.k_proj", 1),
                                    ("value", "self_attn.v_proj", 1),
                                    ("output", f"self_attn.{output}", 2),
                                    ("fc1", "mlp.fc1", 1),
                                    ("fc2", "mlp.fc2", 1))
          for entry in (layer((ours, "kernel"), hf + ".weight",
                              in_ndim=in_ndim),
                        layer((ours, "bias"), hf + ".bias", flatten=True)))


# Per encoder layer (paths inside a `vision.EncoderLayer`).
SIGLIP_LAYER_PARAMS = vision_layer_params(
    SIGLIP_PREFIX + "encoder.layers.", ("layer_norm1", "layer_norm2"),
    "out_proj")
