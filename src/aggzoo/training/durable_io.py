"""Lightning ``CheckpointIO`` plugin writing checkpoints with :func:`~aggzoo.training.safe_save.atomic_save`.

``trainer.plugins=[DurableCheckpointIO()]`` (or the ``plugins`` list of ``conf/trainer``): every
checkpoint Lightning writes (``ModelCheckpoint``, ``trainer.save_checkpoint``) is then atomic and
durable, and a full disk raises :class:`~aggzoo.training.safe_save.DiskFullError`.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO

from aggzoo.training.safe_save import atomic_save

__all__ = ["DurableCheckpointIO"]


class DurableCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint writer using :func:`atomic_save` for local paths (``trainer.plugins``).

    Remote URLs (``s3://``...) are written by Lightning's own writer.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike,
                        storage_options: Any | None = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options=storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options (got {storage_options!r})")
        atomic_save(checkpoint, path)
        return None
