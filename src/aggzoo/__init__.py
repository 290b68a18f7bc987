"""aggzoo: interchangeable feature-aggregation heads for visual place recognition.

Public API (timm / torch.hub style)::

    import aggzoo
    aggzoo.list_models("*dinov2*")              # registered architectures
    aggzoo.list_pretrained("*.official")        # weights: <architecture>.<tag>
    model = aggzoo.create_model("gem_efficientnet_lite0.nordland_mini", pretrained=True)
    aggzoo.save_pretrained(model, "my_model")   # -> create_model("local-dir:my_model")
    model = aggzoo.load_head("gem_efficientnet_lite0.nordland_mini", backbone=my_backbone)

``import aggzoo`` is light and never touches the network: it imports torch, and the registry fills
itself (timm, the heads) on the first call. albumentations' update check is disabled before any
submodule can import it.
"""

import os

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from aggzoo.hub import load_head, save_pretrained  # noqa: E402
from aggzoo.registry import create_model, list_models, list_pretrained  # noqa: E402

__version__ = "0.1.0"

__all__ = ["__version__", "create_model", "list_models", "list_pretrained", "load_head", "save_pretrained"]
