"""Elastic data-parallel training with torch on a node set: ``ElasticTrainer``.

Install the extra: ``pip install 'queueworks[torch]'``. ``import queueworks`` never imports
torch; only this module does. A task in step mode (``TaskSpec(mode="step")``) names a
factory that builds the trainer on every member::

    def make_trainer(ctx: StepContext) -> ElasticTrainer:
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        return ElasticTrainer(ctx, model, opt, loss_fn)   # loss_fn(model, payload) -> (loss, n)

What it does for every generation of the node set (see ``queueworks.task.steps``):

* **Rendezvous through Redis.** The leader (rank 0) opens a fresh ``TCPStore`` on a free
  port and publishes ``host:port`` with the generation under the task's ``rdzv`` key; the
  others wait for exactly that generation, connect, and all meet at an arrival count before
  ``init_process_group`` (gloo on CPU, NCCL with CUDA), so no C++ call waits on a member
  that is not coming. Waiting gives up as soon as the node set changes.
* **Identical state.** Members all-reduce their applied-step counts; the member with the
  most (the leader on ties, i.e. always unless the leader missed a commit) broadcasts model,
  optimizer state and progress, serialized by ``torch.save`` and loaded with
  ``weights_only=True``.
* **Steps.** ``prepare`` runs forward and backward on this member's shard; ``reduce`` is one
  all-reduce of ``grad * n`` plus ``n`` and ``loss * n`` (zero for a member with no shard),
  so the update equals one step on all the step's samples together; ``commit`` applies it.
  Every collective has a short timeout (``collective_timeout``, 10 s), and a member whose
  collective fails destroys its group at once, so peers never wait for a vanished one.
* **Checkpoints.** The leader saves model, optimizer and progress every
  ``checkpoint_steps`` steps or ``checkpoint_seconds`` seconds, and when it leaves, to
  ``checkpoint_path`` (written atomically) or to Redis (``checkpoint_redis``). Every member
  loads the checkpoint when it starts, so losing every member resumes from it.

Options live in ``TaskSpec.options["torch"]`` (``TorchOptions``); the rest of ``options``
belongs to the application.
"""

from __future__ import annotations

from queueworks.errors import StepAborted
from queueworks.task.steps import Generation, StepContext, StepInfo
from queueworks.torch.options import LossFn, StepRecord, TorchOptions
from queueworks.torch.trainer import ElasticTrainer, load_checkpoint, wait_released

__all__ = [
    "ElasticTrainer",
    "Generation",
    "LossFn",
    "StepAborted",
    "StepContext",
    "StepInfo",
    "StepRecord",
    "TorchOptions",
    "load_checkpoint",
    "wait_released",
]
