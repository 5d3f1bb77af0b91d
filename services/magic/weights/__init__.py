"""Weight transports: how policy version k travels from the learner to every rollout worker.

One interface, chosen by the `type` of the weight-transport config (`magic.config.schema`):

    learner                                   rollout worker
    WeightSender.publish(k, state_dict)  ──▶  WeightReceiver.receive(update, engine)
      makes the bytes reachable, then            fetches / checks them and has the engine load
      announces a WeightUpdate on `weights`      them; raises WeightIntegrityError if they are
                                                 incomplete or corrupt

| type         | bytes travel                               | module      |
| ------------ | ------------------------------------------ | ----------- |
| `filesystem` | safetensors on a shared volume + marker     | filesystem  |
| `http`       | the learner's weight server → local cache   | http        |
| `nccl`       | vLLM's NCCL broadcast (GPU pods)            | nccl        |

Every sender keeps its versions in a `FilesystemWeightStore` under the run's `weights/`
directory (for `http` it is what the server serves, for `nccl` the catch-up snapshots), so the
learner resumes from it and `magic local` evaluates from it whatever the transport.
"""

from magic.weights.base import Checkpoint, CheckpointLoader, WeightIntegrityError, WeightReceiver, WeightSender
from magic.weights.factory import make_receiver, make_sender
from magic.weights.filesystem import MARKER, WEIGHTS_FILE, FilesystemWeightStore

__all__ = [
    "MARKER",
    "WEIGHTS_FILE",
    "Checkpoint",
    "CheckpointLoader",
    "FilesystemWeightStore",
    "WeightIntegrityError",
    "WeightReceiver",
    "WeightSender",
    "make_receiver",
    "make_sender",
]
