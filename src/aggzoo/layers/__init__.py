"""Small reusable pieces shared by the heads, one concept per file: global pooling (``pooling``),
its windowed versions for TLC (``local_pool``), log-domain Sinkhorn (``sinkhorn``), attention
blocks (``attention``) and DINOv2's position-embedding resampling (``pos_embed``). The lowest layer
above :mod:`aggzoo.errors`: torch only, no other aggzoo import; :mod:`aggzoo.models` builds on it.
"""
