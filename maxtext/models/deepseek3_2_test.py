"""DeepSeek-V3.2 (DeepSeek Sparse Attention) against transformers'
DeepseekV32ForCausalLM: logits of tiny random models at lengths far past
`index_topk` (each query attends to 4 of up to 100 tokens), stacked and
unstacked layers; the config and weights round trip; bad indexer sizes are
refused. Greedy decoding against transformers' `generate` is in
`maxtext/inference/hf_generate_test.py`, conversion in
`maxtext/checkpoint/hf_convert_test.py` (the family is in
`testing/hf_tiny_models.py`)."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from configs import deepseek3_2 as deepseek3_2_config
from maxtext.common.model_config import ModelConfig
from maxtext.models import deepseek3_2
from testing import hf_reference
from testing import hf_tiny_models

_TOLERANCE = 1e-4


def _hf():
  hf_model = hf_tiny_models.tiny_hf_model("deepseek3_2")
  return hf_model, deepseek3_2.model_config_from_hf(
      hf_model.config.to_dict())


class HuggingFaceTest(parameterized.TestCase):

  @parameterized.parameters((True, 100), (False, 37))
  def test_logits_match(self, scan_layers, length):
    hf_model, cfg = _hf()
    self.assertEqual(cfg.mla.index_topk, 4)
    tokens = np.random.RandomState(0).randint(0, 128, size=(2, length))
    self.assertLessEqual(hf_reference.max_logit_diff(
        hf_model, cfg, tokens, scan_layers=scan_layers), _TOLERANCE)

  def test_config_and_weights_round_trip(self):
    hf_model, cfg = _hf()
    self.assertEqual((cfg.mla.index_num_heads, cfg.mla.index_head_dim),
                     (16, 16))
    self.assertEqual(deepseek3_2.model_config_from_hf(
        deepseek3_2.hf_config_from_model_config(cfg)), cfg)
    hf_reference.assert_round_trip(hf_model, cfg, scan_layers=True)

  @parameterized.parameters(
      (dict(index_num_heads=0), "index_num_heads=0"),
      (dict(index_head_dim=4), r"index_head_dim=4.*at least head_dim=16"),
      (dict(q_lora_rank=0), "q_lora_rank=0.*indexer reads the query"),
      (dict(index_topk=0), "index_num_heads=8.*only index_topk > 0"))
  def test_bad_indexer_sizes_are_refused(self, changes, message):
    model = deepseek3_2_config.get_config().model
    model.update(changes)
    with self.assertRaisesRegex(ValueError, message):
      ModelConfig.from_dict(model)


if __name__ == "__main__":
  absltest.main()
