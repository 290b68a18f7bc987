"""Training with PyTorch Lightning: the LightningModule (``module``), the data module and its P x K
samplers, metric-learning losses, learning-rate schedules, augmentation, callbacks (data-driven head
initialisation, the untrained baseline), guards against non-finite losses, a clean Ctrl-C, atomic
checkpoint files and a checked resume (``checkpointing``). It sits above :mod:`aggzoo.evaluation`,
:mod:`aggzoo.hub`, :mod:`aggzoo.models` and :mod:`aggzoo.data`, and below :mod:`aggzoo.run`, which
builds these objects from the Hydra config.
"""
