"""Vocabulary-parallel output head: logits split over the vocabulary.

Under FSDP the output kernel [D, V] (or a tied embedding table [V, D]) is
split along D like every kernel. Projecting the batch-split tokens with it
makes the partitioner all-gather the whole kernel on every device and, in
the backward pass, all-reduce the whole kernel gradient: for a 32k
vocabulary at width 256 that is 32 MB each way per device, per step.

`logits` instead runs the head in a `jax.shard_map` over the mesh axes A
that split both the kernel's D and the tokens (Megatron's vocabulary-parallel
head, with the FSDP layout kept as stored):

  * the kernel's shard is exchanged with one `all_to_all` over A, from
    [D / |A|, V] to [D, V / |A|] (each device sends (|A| - 1) / |A| of its
    shard once, instead of receiving the whole kernel);
  * the tokens are all-gathered over A ([T, D] activations, T = B * L);
  * each device computes the logits of every token of its group for its
    slice of the vocabulary.

The autodiff transposes are the cheap ones too: the kernel gradient goes
back with the inverse `all_to_all` (no reduction), the token gradient with a
reduce-scatter. The logits leave split over the vocabulary along A (and
over the tokens only along the batch axes outside A), so the loss reduces
over the vocabulary with [T]-sized all-reduces (`train_step.cross_entropy`
is written to partition that way).

Shapes: T tokens, D model width, V vocabulary.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from maxtext.common import axes


@dataclasses.dataclass(frozen=True)
class _Plan:
  """How `logits` splits one head projection.

  Attributes:
    mesh: The mesh of the active compute rules.
    group: Mesh axes A that split both the kernel's width and the tokens:
      the shard_map gathers tokens and exchanges the kernel over them.
    token_axes: The mesh axes that split the tokens (in order; A last).
    vocab_axes: The mesh axes that split the kernel's vocabulary as stored.
  """
  mesh: jax.sharding.Mesh
  group: tuple[str, ...]
  token_axes: tuple[str, ...]
  vocab_axes: tuple[str, ...]


def _plan(names: tuple[str, str], shape: tuple[int, int],
          batch_shape: tuple[int, int]) -> _Plan | None:
  """The plan for a kernel with logical axes `names` and `shape` on a
  [B, L] batch, or None where the plain projection is as good: outside
  `activation_sharding`; where no mesh axis splits both the kernel's width
  and the batch; where the length is split too (sequence parallelism) or
  those axes are not the batch's innermost split (the gathered tokens would
  not be contiguous); where they do not divide the vocabulary."""
  rules = axes.current_constrainer()
  if rules is None or not hasattr(rules, "param_spec"):
    return None
  batch, length = batch_shape
  kernel_axes = axes.spec_axes(rules.param_spec(names, shape), 2)
  group = kernel_axes[names.index(axes.EMBED)]
  vocab_axes = kernel_axes[names.index(axes.VOCAB)]
  token_axes, = axes.spec_axes(rules.compute_spec((axes.BATCH,), (batch,)),
                               1)
  if (not group or token_axes[len(token_axes) - len(group):] != group or
      axes.splits(axes.LENGTH, length)):
    return None
  splits = math.prod(rules.mesh.shape[a] for a in (*vocab_axes, *group))
  if shape[names.index(axes.VOCAB)] % splits:
    return None
  return _Plan(rules.mesh, group, token_axes, vocab_axes)


def logits(x_BLD: jax.Array, kernel: jax.Array,
           names: tuple[str, str]) -> jax.Array | None:
  """Logits [B, L, V] = x_BLD . kernel, split over the vocabulary (module
  doc), or None where that gains nothing (then project as usual).

  Args:
    x_BLD: Final hidden states, in the compute dtype.
    kernel: The head kernel [D, V] or tied embedding table [V, D], in the
      compute dtype, as the active parameter rules place it.
    names: Its logical axes: (EMBED, VOCAB) or (VOCAB, EMBED).
  """
  b, l, d = x_BLD.shape
  p = _plan(names, kernel.shape, (b, l))
  if p is None:
    return None
  vocab_dim = names.index(axes.VOCAB)
  embed_dim = names.index(axes.EMBED)
  kernel_spec = [None, None]
  kernel_spec[embed_dim] = p.group
  kernel_spec[vocab_dim] = p.vocab_axes or None
  outer = p.token_axes[:len(p.token_axes) - len(p.group)]

  def local(x_TD, kernel):
    x_TD = jax.lax.all_gather(x_TD, p.group, axis=0, tiled=True)
    kernel = jax.lax.all_to_all(kernel, p.group, split_axis=vocab_dim,
                                concat_axis=embed_dim, tiled=True)
    return jnp.einsum("td,dv->tv" if vocab_dim else "td,vd->tv", x_TD,
                      kernel)

  logits_TV = jax.shard_map(
      local, mesh=p.mesh,
      in_specs=(PartitionSpec(p.token_axes, None),
                PartitionSpec(*kernel_spec)),
      out_specs=PartitionSpec(outer or None, (*p.vocab_axes, *p.group)),
  )(x_BLD.reshape(b * l, d), kernel)
  return logits_TV.reshape(b, l, -1)
