"""The hub: what a model name means and how a model is built, saved and loaded. Its modules are
layered, each importing only those before it: ``cfg`` (:class:`~aggzoo.hub.cfg.PretrainedCfg`, one
set of weights) <- ``registry`` (the architecture and weights tables) <- ``builder`` (the one spec
builder, with an allowlist of aggzoo's backbone and head classes) <- ``io`` (the one checkpoint
reader :func:`~aggzoo.hub.io.read_checkpoint`, the download cache, ``save_pretrained``; ``remap``
holds its key-renaming helpers) <- ``manifest`` (``weights/manifest.json``) <- ``factory``
(``create_model``, ``load_head``, the listings). The package sits above :mod:`aggzoo.models` and
below :mod:`aggzoo.zoo`, which registers into its tables; only ``factory`` imports the zoo, and this
file imports nothing, so ``import aggzoo.hub.io`` does not load it.
"""
