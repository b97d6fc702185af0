"""The post-training train step: one function our trainers run and
`aot_compile` compiles.

Tunix's trainers (`PeftTrainer` for sft, `DPOTrainer` for DPO/ORPO,
`DistillationTrainer`, the RL actor trainer of GRPO) jit what their public
`create_train_step_fn()` returns. `tunix_hooks.run_our_step` makes each of
ours return `train_step` bound to the trainer's own loss (`for_model`), so
the step that trains is this one, and `maxtext.aot.compile_tunix` lowers
`train_step` bound to the same loss on the same (model, optimizer,
batch): a Tunix upgrade cannot make the two differ.

The step: the trainer's `gen_model_input_fn` turns the batch into the loss's
keyword arguments; the loss's value and gradient are taken with respect to
the trainable variables (the LoRA adapters when the model has any, else
every parameter); the optimizer updates the model in place; it returns
(loss, aux or None, gradient norm), what Tunix's train loop expects.
"""

from collections.abc import Callable
from typing import Any

from flax import nnx
import jax
import optax

from maxtext.posttrain import base_model


def train_step(model: nnx.Module, optimizer: nnx.Optimizer, inputs: Any, *,
               loss_fn: Callable[..., Any],
               gen_model_input_fn: Callable[[Any], dict[str, Any]],
               has_aux: bool, wrt: Any) -> tuple[jax.Array, Any, jax.Array]:
  """One train step of `model` and its `optimizer` (updated in place) on
  the batch `inputs`.

  Args:
    model: The trained model.
    optimizer: Its optimizer (over the `wrt` variables).
    inputs: One batch as the trainer receives it.
    loss_fn: The loss, called as `loss_fn(model, **gen_model_input_fn(x))`.
    gen_model_input_fn: The loss's keyword arguments from one batch.
    has_aux: Whether `loss_fn` returns (loss, aux).
    wrt: The trainable variables' filter (`base_model.trainable_filter`).

  Returns:
    (loss, aux or None, the gradients' global norm).
  """
  grad_fn = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, wrt),
                               has_aux=has_aux)
  out, grads = grad_fn(model, **gen_model_input_fn(inputs))
  grad_norm = optax.global_norm(grads)
  optimizer.update(model, grads)
  loss, aux = out if has_aux else (out, None)
  return loss, aux, grad_norm


def for_model(model: nnx.Module, loss_fn: Callable[..., Any], *,
              has_aux: bool,
              gen_model_input_fn: Callable[[Any], dict[str, Any]]
              ) -> Callable[[nnx.Module, nnx.Optimizer, Any],
                            tuple[jax.Array, Any, jax.Array]]:
  """`train_step` training `model` (its adapters if it has any) on
  `loss_fn`, called as `posttrain_step(model, optimizer, inputs)`
  ("jit_posttrain_step" in logs, profiles and the compilation cache)."""
  wrt = base_model.trainable_filter(model)

  def posttrain_step(model, optimizer, inputs):
    return train_step(model, optimizer, inputs, loss_fn=loss_fn,
                      gen_model_input_fn=gen_model_input_fn, has_aux=has_aux,
                      wrt=wrt)

  return posttrain_step
