"""The execution sections' own checks, and the combinations a model cannot
run refused by `Execution.check`, by the decoder and by the config front
door, each naming its keys."""


from absl.testing import absltest
from absl.testing import parameterized

from configs import llama3
from maxtext.common.model_config import ModelConfig
from maxtext.kernels import dispatch
from maxtext.layers import pipeline
from maxtext.layers import remat
from maxtext.models import decoder
from maxtext.models import execution
from maxtext.trainers.config import ExperimentConfig

_LLAMA = ModelConfig.from_dict(dict(family="llama3", vocab_size=32,
                                    num_layers=4, embed_dim=16, mlp_dim=32,
                                    num_heads=4, num_kv_heads=2, head_dim=8))


def _piped(stages=2, **pipeline_values) -> execution.Execution:
  return execution.Execution(pipeline=pipeline.PipelineConfig(
      stages=stages, **pipeline_values))


class SectionChecksTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("impl", lambda: dispatch.Kernel(impl="pallas"),
       "attention_kernel.impl='pallas' is invalid; valid values: .*'splash'"),
      ("block", lambda: dispatch.Kernel(block_kv=0),
       "attention_kernel.block_kv=0 must be an integer >= 1"),
      ("stages", lambda: pipeline.PipelineConfig(stages=0),
       "pipeline.stages=0 must be a positive integer"),
      ("microbatches", lambda: pipeline.PipelineConfig(microbatches=-1),
       "pipeline.microbatches=-1 must be an integer >= 0"),
      ("circular", lambda: pipeline.PipelineConfig(stages=2, repeats=2,
                                                   microbatches=1),
       r"pipeline.microbatches=1: the circular schedule \(pipeline.repeats=2\)"
       r" needs at least pipeline.stages=2 microbatches"),
      ("policy", lambda: remat.RematConfig(policy="some"),
       "remat.policy='some' is invalid; valid values: .*'save_qkv_proj'"),
      ("custom_without_policy",
       lambda: remat.RematConfig(custom={"mlp_out": "keep"}),
       "only policy=\"custom\" reads it, not remat.policy='none'"),
  )
  def test_bad_value_is_named(self, build, message):
    with self.assertRaisesRegex(ValueError, message):
      build()


class CheckTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("softcap_xla",
       execution.Execution(attention_kernel=dispatch.Kernel(impl="xla")),
       dict(attn_logit_softcap=50.0),
       r"attention_kernel.impl='xla' has no attention-logit soft-cap"
       r" \(model.attn_logit_softcap=50.0\)"),
      ("sinks_cudnn",
       execution.Execution(attention_kernel=dispatch.Kernel(impl="cudnn")),
       dict(attention_sinks=True),
       r"attention_kernel.impl='cudnn' has no attention sinks"),
      ("sinks_xla",
       execution.Execution(attention_kernel=dispatch.Kernel(impl="xla")),
       dict(attention_sinks=True),
       r"attention_kernel.impl='xla' has no attention sinks"),
      ("ring_mla",
       execution.Execution(
           attention_kernel=dispatch.Kernel(context_parallel="ring")),
       dict(attention_type="mla", num_kv_heads=4, q_lora_rank=8,
            kv_lora_rank=8, qk_nope_head_dim=8, v_head_dim=8),
       "\"ring\" serves attention_type=\"gqa\" layers only"),
      ("stages_divide", _piped(3), {},
       "pipeline.stages=3: must divide model.num_layers=4"),
      ("repeats_divide", _piped(2, repeats=4), dict(num_layers=6),
       r"pipeline.repeats=4: pipeline.stages=2 \* repeats must divide"
       r" model.num_layers=6; valid repeats: \[1, 3\]"),
      ("unscanned", _piped(), dict(scan_layers=False),
       "pipelining needs model.scan_layers=True"),
      ("experts", _piped(), dict(num_experts=4, moe_mlp_dim=8),
       r"not supported with experts \(model.num_experts=4\)"),
      ("mtp", _piped(), dict(mtp_layers=1),
       r"multi-token prediction \(model.mtp_layers=1\)"),
      ("kv_sharing", _piped(), dict(kv_shared_layers=1),
       r"keys and values shared across layers \(model.kv_shared_layers=1\)"),
      ("per_layer_inputs", _piped(), dict(per_layer_input_dim=8),
       r"per-layer inputs \(model.per_layer_input_dim=8\)"),
      ("kinds_in_chunks_that_differ", _piped(),
       dict(sliding_window=4, global_layer_interval=3, global_head_dim=16),
       r"with several layer kinds \(\['blocks', 'global_blocks'\];.*every"
       r" chunk of 2 layers .* this model's chunks differ"),
  )
  def test_refused_everywhere(self, run, changes, message):
    cfg = _LLAMA.replace(**changes)
    with self.assertRaisesRegex(ValueError, message):
      run.check(cfg)
    with self.assertRaisesRegex(ValueError, message):
      decoder.Decoder(cfg, rngs=None, execution=run)

  def test_what_runs_passes(self):
    execution.Execution().check(_LLAMA)
    _piped(2, repeats=2, microbatches=2).check(_LLAMA)
    # Two kinds whose chunks (local, global) repeat.
    _piped(2).check(_LLAMA.replace(sliding_window=4, global_layer_interval=2,
                                   global_head_dim=16))
    execution.Execution(
        attention_kernel=dispatch.Kernel(impl="xla", context_parallel="ring"),
        remat=remat.RematConfig(policy="custom",
                                custom={"mlp_hidden": "offload"})
    ).check(_LLAMA)

  def test_the_config_front_door_checks_before_any_work(self):
    config = llama3.get_config()
    config.model.num_layers = 3
    config.mesh.ici.stage = 2
    self.assertEqual(config.pipeline.stages, 2)  # Follows the mesh.
    with self.assertRaisesRegex(
        ValueError, "^pipeline.stages=2: must divide model.num_layers=3.$"):
      ExperimentConfig.from_config_dict(config)
    config = llama3.get_config()
    config.model.remat_policy = "full"  # A config file of the flat form.
    with self.assertRaisesRegex(
        ValueError, "^Config key 'model.remat_policy' moved to"
        " 'remat.policy'; set --config.remat.policy instead.$"):
      ExperimentConfig.from_config_dict(config)
    config = llama3.get_config()
    config.remat.policy = "full"
    config.attention_kernel.impl = "reference"
    experiment = ExperimentConfig.from_config_dict(config)
    self.assertEqual(experiment.execution, execution.Execution(
        attention_kernel=dispatch.Kernel(impl="reference"),
        remat=remat.RematConfig(policy="full")))


if __name__ == "__main__":
  absltest.main()
