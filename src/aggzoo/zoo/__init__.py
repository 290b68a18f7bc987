"""The model zoo: every registered architecture (``@register_model`` entry points) and the official
weights of each, one module per method. Importing this package fills the registry; ``aggzoo``
imports it lazily, on the first ``create_model`` / ``list_models`` call."""

from aggzoo.zoo import baselines, boq, convap, cosplace, edtformer, image, mixvpr, netvlad, new_heads, salad

__all__ = ["baselines", "boq", "convap", "cosplace", "edtformer", "image", "mixvpr", "netvlad", "new_heads", "salad"]
