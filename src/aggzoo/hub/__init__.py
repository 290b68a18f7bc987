"""The hub: what a model name means and how a model is built, saved and loaded. Its modules are
layered, each importing only those before it:

- ``cfg``: :class:`~aggzoo.hub.cfg.PretrainedCfg`, one set of weights;
- ``registry``: the architecture and weights tables;
- ``builder``: the one spec builder, with an allowlist of aggzoo's backbone and head classes;
- ``remap``: state-dict helpers and the key-renaming rules converters use;
- ``ensembling``: the weight-ensembling (WiSE-FT) record a training checkpoint carries, and the mix;
- ``checkpoint``: the one checkpoint reader :func:`~aggzoo.hub.checkpoint.read_checkpoint` (safe
  reading, sha256, unwrapping);
- ``card``: the model card of a saved folder;
- ``saving``: ``save_pretrained``'s folder, written and read back;
- ``download``: the shipped-weights folder, the download cache, Hugging Face sources;
- ``loading``: strict loading of a state dict into a model, ``load_pretrained``;
- ``manifest``: ``weights/manifest.json``;
- ``publish``: ``push_to_hub``;
- ``factory``: ``create_model``, ``load_head``, the listings.

The package sits above :mod:`aggzoo.models` and below :mod:`aggzoo.zoo`, which registers into its
tables; only ``factory`` imports the zoo, and this file imports nothing, so ``import
aggzoo.hub.checkpoint`` does not load it.
"""
