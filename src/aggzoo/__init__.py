"""aggzoo: interchangeable feature-aggregation heads for visual place recognition.

``import aggzoo`` never touches the network: albumentations' update check is disabled before any
submodule can import it.
"""

import os

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

__version__ = "0.1.0"

__all__ = ["__version__"]
