"""The declaration of data-driven initialisation, shared by heads and backbones.

A module that is initialised from training data before the first step (NetVLAD's centroids, GSP's
prototypes, ImAge's aggregation tokens) says so on its class with :attr:`DataInitDeclaring.data_init`
and implements the methods of that kind; the ``HeadDataInit`` callback
(:mod:`aggzoo.training.callbacks`) selects modules by the declared kind and calls exactly these
methods, never looking for them with ``hasattr``:

- ``"kmeans"``: k-means (:attr:`kmeans_clusters` centres) of L2-normalised local features of the
  backbone (:meth:`aggzoo.models.backbones.timm_backbone.TimmBackbone.data_init_features`), then
  :meth:`init_from_clusters` ``(centroids [K, C], descriptors [N, C])``;
- ``"pooled"``: :meth:`pooled_embedding` ``(features) -> [B, D]`` of training images, then
  :meth:`init_from_pooled` ``(embeddings [N, D])``;
- ``"none"`` (the default): nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from torch import Tensor

if TYPE_CHECKING:
    from aggzoo.models.features import Features

__all__ = ["DATA_INIT_METHODS", "DataInit", "DataInitDeclaring"]

DataInit = Literal["none", "kmeans", "pooled"]

#: the method(s) each kind of data-driven initialisation calls, in call order
DATA_INIT_METHODS: dict[str, tuple[str, ...]] = {
    "none": (),
    "kmeans": ("kmeans_clusters", "init_from_clusters"),
    "pooled": ("pooled_embedding", "init_from_pooled"),
}


class DataInitDeclaring:
    """Mixin of :class:`~aggzoo.models.heads.base.Head` and
    :class:`~aggzoo.models.backbones.timm_backbone.TimmBackbone`: the declared kind and the
    methods it calls (each raising until a subclass that declares the kind implements it)."""

    #: how this module is initialised from data before training (see the module docstring)
    data_init: ClassVar[DataInit] = "none"
    #: declarations, not part of the forward: TorchScript must not compile them (``torch.jit.script``)
    __jit_unused_properties__: ClassVar[list[str]] = [
        "kmeans_clusters", "required_map_size", "required_tokens", "min_positions", "batch_dependent"]

    @property
    def kmeans_clusters(self) -> int | None:
        """``data_init = "kmeans"``: the number of k-means centres :meth:`init_from_clusters` takes
        (``None`` otherwise; a property must not raise: tracers read every attribute)."""
        return None

    def init_from_clusters(self, centroids: Tensor, descriptors: Tensor) -> None:
        """``data_init = "kmeans"``: set parameters from k-means ``centroids [K, C]`` of the local
        ``descriptors [N, C]``."""
        raise NotImplementedError(f"{type(self).__name__} declares data_init={self.data_init!r}, not 'kmeans'")

    def pooled_embedding(self, features: Features) -> Tensor:
        """``data_init = "pooled"``: the per-image embedding ``[B, D]`` :meth:`init_from_pooled` collects."""
        raise NotImplementedError(f"{type(self).__name__} declares data_init={self.data_init!r}, not 'pooled'")

    def init_from_pooled(self, embeddings: Tensor) -> None:
        """``data_init = "pooled"``: set parameters from the :meth:`pooled_embedding` of N images ``[N, D]``."""
        raise NotImplementedError(f"{type(self).__name__} declares data_init={self.data_init!r}, not 'pooled'")
