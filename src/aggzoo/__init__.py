"""aggzoo: interchangeable feature-aggregation heads for visual place recognition.

Public API (timm / torch.hub style)::

    import aggzoo
    aggzoo.list_models("*dinov2*")              # registered architectures
    aggzoo.list_pretrained("*.official")        # weights: <architecture>.<tag>
    model = aggzoo.create_model("netvlad_efficientnet_lite0.nordland_mini", pretrained=True)
    aggzoo.save_pretrained(model, "my_model")   # -> create_model("local-dir:my_model")
    aggzoo.push_to_hub(model, "me/my_model")    # -> create_model("hf-hub:me/my_model")
    model = aggzoo.load_head("netvlad_efficientnet_lite0.nordland_mini", backbone=my_backbone)

``import aggzoo`` is light: it imports nothing but this file, and never touches the network. The
names above load :mod:`aggzoo.hub.factory` (torch, timm and the zoo) on first use (PEP 562), so
lightning, hydra, faiss and albumentations are imported only by the pipeline that needs them.
albumentations' update check is disabled before any submodule can import it.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

__version__ = "0.1.0"

#: public name -> the module that defines it
_API = {
    "create_model": "aggzoo.hub.factory",
    "list_models": "aggzoo.hub.factory",
    "list_pretrained": "aggzoo.hub.factory",
    "load_head": "aggzoo.hub.factory",
    "save_pretrained": "aggzoo.hub.saving",
    "push_to_hub": "aggzoo.hub.publish",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'aggzoo' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
