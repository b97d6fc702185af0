"""The `checkpoint` config section: when and where checkpoints are saved.

`CheckpointConfig` is the typed, validated `checkpoint` section: how often
and how many checkpoints the persistent tier (`<workdir>/checkpoints`)
saves and keeps, whether saves are asynchronous, and the optional fast local
tier (`local_dir`). The checkpointers that save and restore by it are
`maxtext.checkpoint.manager`.
"""

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
  """The `checkpoint` config section.

  Attributes:
    every_steps: Save to the persistent tier (`<workdir>/checkpoints`) every
      this many updates (and always at the end of a run or on preemption);
      0 saves only then.
    max_to_keep: Most recent persistent checkpoints kept.
    async_save: Write files in the background while training continues.
    every_minutes: Also save to the persistent tier when this many minutes
      passed since its last save (process 0's clock decides); 0 is off.
    local_dir: The fast local tier (local SSD or RAM disk), relative to the
      workdir and inside it (a symlink in the workdir may point elsewhere);
      empty turns the tier off. It must be visible to every process unless
      `local_peers`.
    local_every_steps: Save to the local tier every this many updates.
    local_max_to_keep: Most recent local checkpoints kept.
    local_peers: `local_dir` is each process's own storage; a process that
      lost its local checkpoints restores them from a peer replica
      (`maxtext.checkpoint.peer`).
  """

  every_steps: int
  max_to_keep: int
  async_save: bool
  every_minutes: float = 0.0
  local_dir: str = ""
  local_every_steps: int = 0
  local_max_to_keep: int = 2
  local_peers: bool = False

  def __post_init__(self):
    if self.every_steps < 0:
      raise ValueError(
          f"checkpoint.every_steps={self.every_steps!r} must be >= 0.")
    if self.max_to_keep < 1:
      raise ValueError(
          f"checkpoint.max_to_keep={self.max_to_keep!r} must be >= 1.")
    if self.every_minutes < 0:
      raise ValueError(
          f"checkpoint.every_minutes={self.every_minutes!r} must be >= 0"
          " (0 is off).")
    if self.local_max_to_keep < 1:
      raise ValueError(
          f"checkpoint.local_max_to_keep={self.local_max_to_keep!r} must be"
          " >= 1.")
    if self.local_dir and self.local_every_steps < 1:
      raise ValueError(
          f"checkpoint.local_every_steps={self.local_every_steps!r} must be"
          f" >= 1 with checkpoint.local_dir={self.local_dir!r}.")
    if self.local_peers and not self.local_dir:
      raise ValueError(
          "checkpoint.local_peers=True needs checkpoint.local_dir (each"
          " process's local folder); set it or set local_peers=False.")
    if not self.local_dir and self.local_every_steps:
      raise ValueError(
          f"checkpoint.local_every_steps={self.local_every_steps!r} needs"
          " checkpoint.local_dir (the local tier's folder); set it or set"
          " local_every_steps=0.")
