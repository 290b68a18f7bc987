"""torch.hub entry points: every registered aggzoo architecture and every ``<architecture>.<tag>``.

    import torch
    model = torch.hub.load("<path to an aggzoo checkout>", "netvlad_efficientnet_lite0.nordland_mini",
                           source="local", pretrained=True)

    import aggzoo
    aggzoo.list_pretrained()    # every tagged name (torch.hub.list and torch.hub.help take GitHub repos only)
    aggzoo.list_models()        # every architecture

Each entry calls :func:`aggzoo.create_model` with the same arguments. Tagged names load their
weights by default (``pretrained=True``); bare architecture names build an untrained model.
"""

import os
import sys

dependencies = ["torch", "timm", "safetensors"]

# A checkout works without `pip install`: its src/ comes first on the path.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src")
if os.path.isdir(_SRC) and _SRC not in sys.path:
    sys.path.insert(0, _SRC)

from aggzoo.hub.factory import create_model, list_models, list_pretrained, model_entrypoint  # noqa: E402


def _entry(name: str, pretrained_default: bool):
    architecture = name.partition(".")[0]
    summary = (model_entrypoint(architecture).__doc__ or architecture).strip().splitlines()[0]

    def entry(pretrained: bool = pretrained_default, **kwargs):
        return create_model(name, pretrained=pretrained, **kwargs)

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = f"{summary}\n\nSame as aggzoo.create_model({name!r}, pretrained=pretrained, **kwargs)."
    return entry


for _name in list_models():
    globals()[_name] = _entry(_name, pretrained_default=False)
for _name in list_pretrained():
    globals()[_name] = _entry(_name, pretrained_default=True)
del _name
