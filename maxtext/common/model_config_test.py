"""Tests of ModelConfig validation and derived values."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.common import model_config
from maxtext.common.model_config import ModelConfig

_VALID = dict(family="test", vocab_size=32, num_layers=8, embed_dim=16,
              mlp_dim=32, num_heads=4, num_kv_heads=2, head_dim=8)


class ModelConfigTest(parameterized.TestCase):

  def test_from_dict_builds_the_config(self):
    cfg = ModelConfig.from_dict(_VALID)
    self.assertEqual(cfg, ModelConfig.from_dict(_VALID))

  def test_from_dict_names_unknown_key_and_valid_fields(self):
    with self.assertRaisesRegex(TypeError, r"\['num_head'\].*num_heads"):
      ModelConfig.from_dict({**_VALID, "num_head": 4})

  @parameterized.parameters(("norm_eps", float("nan")),
                            ("rope_theta", float("inf")),
                            ("final_logit_softcap", float("-inf")))
  def test_a_nan_or_infinite_value_is_named(self, key, value):
    # A Hugging Face config.json may hold NaN or Infinity (Python's json
    # reads them); the ranges below would let NaN through.
    with self.assertRaisesRegex(
        ValueError, rf"^model\.{key}={value!r} must be a finite number\.$"):
      ModelConfig.from_dict({**_VALID, key: value})

  @parameterized.parameters(*model_config.MOVED_KEYS.items())
  def test_a_moved_key_names_where_it_went(self, old, new):
    with self.assertRaisesRegex(
        ValueError, rf"^Config key 'model.{old}' moved to '{new}'; set"
        rf" --config.{new} instead.$"):
      ModelConfig.from_dict({**_VALID, old: None})

  def test_migrate_drops_the_keys_that_moved_out(self):
    # The flat form written before execution left the model: every moved
    # key with a value of its time.
    old = {**_VALID, "attention_impl": "splash", "attention_block_q": 8,
           "attention_block_kv": 8, "context_parallel": "ring",
           "remat_policy": "custom",
           "remat_custom": [["mlp_hidden", "offload"]],
           "pipeline_stages": 2, "pipeline_microbatches": 4,
           "pipeline_repeats": 2}
    self.assertEqual(set(old) - set(_VALID), set(model_config.MOVED_KEYS))
    self.assertEqual(ModelConfig.from_dict(model_config.migrate(old)),
                     ModelConfig.from_dict(_VALID))
    self.assertEqual(model_config.migrate(_VALID), _VALID)

  def test_parts_hold_their_keys_and_to_dict_gives_them_back(self):
    values = {**_VALID, "rope_theta": 5e5, "num_experts": 4,
              "moe_mlp_dim": 8, "num_experts_per_token": 2,
              "moe_impl": "capacity", "sliding_window": 4,
              "global_layer_interval": 2, "norm_eps": 1e-5,
              "mtp_layers": 1}
    cfg = ModelConfig.from_dict(values)
    self.assertEqual(
        (cfg.attention.num_heads, cfg.mlp.dim, cfg.rope.theta,
         cfg.moe.impl, cfg.moe.mlp_dim, cfg.pattern.sliding_window,
         cfg.norm.eps, cfg.mtp.layers),
        (4, 32, 5e5, "capacity", 8, 4, 1e-5, 1))
    flat = cfg.to_dict()
    self.assertEqual(set(flat), set(ModelConfig.keys()))
    self.assertEqual({k: flat[k] for k in values}, values)
    self.assertEqual(ModelConfig.from_dict(flat), cfg)
    self.assertEqual(cfg.replace(moe_impl="dense").moe.impl, "dense")
    self.assertEqual(cfg.replace(num_layers=2).num_layers, 2)

  def test_every_key_belongs_to_one_part_or_the_model(self):
    part_keys = [key for part in model_config.PARTS.values()
                 for key in part.KEYS.values()]
    self.assertEqual(len(part_keys), len(set(part_keys)))
    for name, part in model_config.PARTS.items():
      self.assertEqual(set(part.KEYS),
                       {f.name for f in dataclasses.fields(part)}, name)
    top = {f.name for f in dataclasses.fields(ModelConfig)
           if f.name not in model_config.PARTS}
    self.assertFalse(top & set(part_keys))
    self.assertEqual(set(ModelConfig.keys()), top | set(part_keys))

  @parameterized.parameters(
      (dict(kv_lora_rank=0), "kv_lora_rank"),
      (dict(num_kv_heads=2), "num_kv_heads"),
      (dict(qk_norm=True), "qk_norm"),
      (dict(attention_type="mqa"), "attention_type"),
      (dict(attention_type="gqa"), "q_lora_rank"),
  )
  def test_bad_mla_config_is_named(self, changes, field):
    mla = dict(_VALID, attention_type="mla", num_kv_heads=4, q_lora_rank=16,
               kv_lora_rank=12, qk_nope_head_dim=6, v_head_dim=10)
    with self.assertRaisesRegex(ValueError, f"ModelConfig.{field}="):
      ModelConfig.from_dict({**mla, **changes})

  def test_is_frozen(self):
    cfg = ModelConfig.from_dict(_VALID)
    with self.assertRaises(dataclasses.FrozenInstanceError):
      cfg.num_layers = 2

  @parameterized.named_parameters(
      ("zero_layers", dict(num_layers=0), "num_layers=0", "positive integer"),
      ("float_dim", dict(embed_dim=16.0), "embed_dim=16.0", "positive integer"),
      ("kv_heads", dict(num_kv_heads=3), "num_kv_heads=3", "divide num_heads"),
      ("odd_head_dim", dict(head_dim=7), "head_dim=7", "even"),
      ("dtype", dict(dtype="fp8"), "dtype='fp8'", "float32"),
      ("activation", dict(mlp_activation="relu"), "mlp_activation='relu'",
       "gelu_tanh"),
      ("rope", dict(rope_scaling="ntk"), "rope_scaling='ntk'", "yarn"),
      ("default_factor", dict(rope_scaling_factor=8.0),
       "rope_scaling_factor=8.0", "default"),
      ("llama3_factors",
       dict(rope_scaling="llama3", rope_scaling_factor=8.0,
            rope_low_freq_factor=4.0, rope_high_freq_factor=1.0),
       "rope_high_freq_factor=1.0", "rope_low_freq_factor"),
      ("window", dict(sliding_window=-1), "sliding_window=-1", ">= 0"),
      ("interval_without_window", dict(global_layer_interval=6),
       "global_layer_interval=6", "sliding_window=0"),
      ("window_never_used", dict(sliding_window=4),
       "global_layer_interval=1", "every layer global"),
      ("bool", dict(scan_layers=1), "scan_layers=1", "True or False"),
      ("bias_bool", dict(qkv_bias="yes"), "qkv_bias='yes'", "True or False"),
      ("query_scalar", dict(query_pre_attn_scalar=-1.0),
       "query_pre_attn_scalar=-1.0", "positive"),
      ("dense_layers", dict(num_experts=4, moe_mlp_dim=8,
                            first_dense_layers=8),
       "first_dense_layers=8", "below num_layers=8"),
      ("dense_layers_without_experts", dict(first_dense_layers=1),
       "num_experts=0", "first_dense_layers is set"),
      ("per_layer_inputs", dict(per_layer_input_dim=-8),
       "per_layer_input_dim=-8", ">= 0"),
      ("kv_shared_mlp", dict(kv_shared_layers=2, mlp_kv_shared_dim=-1),
       "mlp_kv_shared_dim=-1", ">= 0"),
  )
  def test_invalid_value_names_field_value_and_valid_values(
      self, override, field_and_value, valid):
    with self.assertRaises(ValueError) as error:
      ModelConfig.from_dict({**_VALID, **override})
    self.assertIn(f"ModelConfig.{field_and_value}", str(error.exception))
    self.assertIn(valid, str(error.exception))

  def test_layer_windows_all_global_without_window(self):
    self.assertEqual(ModelConfig.from_dict(_VALID).layer_windows(), (None,) * 8)

  def test_layer_windows_local_global_pattern(self):
    cfg = ModelConfig.from_dict(
        dict(**_VALID, sliding_window=4, global_layer_interval=3))
    self.assertEqual(cfg.layer_windows(),
                     (4, 4, None, 4, 4, None, 4, 4))

  def test_layer_windows_all_local(self):
    cfg = ModelConfig.from_dict(
        dict(**_VALID, sliding_window=4, global_layer_interval=0))
    self.assertEqual(cfg.layer_windows(), (4,) * 8)

  def test_query_scale(self):
    self.assertEqual(ModelConfig.from_dict(_VALID).query_scale, 8**-0.5)
    cfg = ModelConfig.from_dict(dict(**_VALID, query_pre_attn_scalar=16.0))
    self.assertEqual(cfg.query_scale, 0.25)


if __name__ == "__main__":
  absltest.main()
