"""What one set of weights is: where it comes from, what it expects, what it reaches.

A registered architecture (``gem_efficientnet_lite0``) can have several sets of weights, each named
by a tag (``netvlad_efficientnet_lite0.nordland_mini``, ``salad_dinov2_vitb14.official``). Each tag has
one :class:`PretrainedCfg`: the weight source (a file shipped in ``weights/``, a URL, a Hugging Face
repository), its sha256, the preprocessing it was trained with, the descriptor size, the recipe
that made it, its licence and paper, and the metrics it reaches.

The lowest layer of :mod:`aggzoo.hub`: nothing here touches the network or the disk, and it imports
nothing of aggzoo (:mod:`aggzoo.hub.download` and :mod:`aggzoo.hub.loading` do the loading).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Literal

import torch
from huggingface_hub import hf_hub_url
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

__all__ = ["METRIC_SETUPS", "PretrainedCfg", "RemapFn", "split_metric_key", "split_name"]

#: A named key-remapping function: ``(checkpoint state dict, target model) -> state dict in the
#: target's key names``. It may read the target's shapes (to resample a position embedding) but
#: never modifies the model.
RemapFn = Callable[[Mapping[str, torch.Tensor], torch.nn.Module], dict[str, torch.Tensor]]


def split_name(name: str) -> tuple[str, str | None]:
    """``"salad_dinov2_vitb14.official"`` -> ``("salad_dinov2_vitb14", "official")``; no tag -> ``None``."""
    architecture, dot, tag = name.partition(".")
    return architecture, (tag if dot else None)


#: the ground-truth setups of a metric key ``"<benchmark>/<setup>/<metric>"`` (revisited Oxford / Paris)
METRIC_SETUPS = ("easy", "medium", "hard")


def split_metric_key(key: str) -> tuple[str, str | None, str]:
    """A :attr:`PretrainedCfg.metrics` key -> ``(benchmark, setup, metric)``.

    ``"pitts30k_test/R@1"`` -> ``("pitts30k_test", None, "R@1")``; ``"roxford5k/medium/mAP"`` ->
    ``("roxford5k", "medium", "mAP")`` (the setup is one of :data:`METRIC_SETUPS`); a key without a ``/`` has
    no benchmark (``("", None, key)``)."""
    head, _, metric = key.rpartition("/")
    benchmark, _, setup = head.rpartition("/")
    if benchmark and setup in METRIC_SETUPS:
        return benchmark, setup, metric
    return head, None, metric


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class PretrainedCfg:
    """One tag of one architecture.

    Weight source (the first one that is available wins, in this order):
        file: a file inside the repository's ``weights/`` folder (shipped with aggzoo).
        url: a direct download URL (``https://``; ``file://`` works too), cached on first use.
        hf_hub_id / hf_hub_filename: a file in a Hugging Face Hub repository, cached on first use.
        download_page: a page where a person downloads the file (Google Drive links cannot be
            fetched by a program); the loader then says where to place it.
        filename: the file's name in the cache (default: the last part of the URL / the Hub name).
        sha256: hex digest the file must have. ``None`` means "not pinned": only for upstream files
            nobody on the project could download yet; the loader then prints the digest it saw.

    What the file holds and how it maps onto the model:
        contents: ``"full"`` -- every tensor of the model (strict load). ``"delta"`` -- the model is
            built with its pretrained backbone and the file holds only the tensors that differ from
            it (every ``head.*`` key, plus the backbone tensors training changed); backbone keys
            absent from the file keep the pretrained backbone's values.
        remap: the named key-remapping function for a foreign (upstream) checkpoint, or ``None``
            when the file already uses aggzoo's names.
        model_kwargs: arguments for the architecture's entry point that this variant needs (a
            descriptor size, an image size), applied before the caller's own overrides.

    Preprocessing: input_size ``(3, H, W)``, mean/std on 0..1 RGB, resize interpolation.
        eval_resize: how the evaluation resizes to input_size, as the metrics were measured (the default
            protocol of ``eval.py model=<name>``, :mod:`aggzoo.evaluation.protocol`): ``"protocol"`` --
            the published protocols' PIL resize with antialiasing, sides snapped to the patch size or
            stride; ``"pipeline"`` -- aggzoo's own evaluation resize (:func:`aggzoo.data.transforms.eval_transform`),
            the one a ``train.py`` run measures its test metrics with (the shipped weights).
        eval_metric: the search metric the metrics were measured with: ``"ip"`` (inner product) or ``"l2"``
            (``faiss.IndexFlatL2``, as the gmberton/deep-visual-geo-localization-benchmark family does; it
            ranks descriptors that are not unit-norm differently).
        eval_whitening_kind: the PCA the metrics used when they were measured after a PCA (fitted by
            ``evaluation.postprocess.whitening_fit``): ``"whiten"`` (PCA-whitening + L2) or ``"project"`` (sklearn's plain
            ``PCA.transform``, no L2; :mod:`aggzoo.evaluation.postprocess`).

    Provenance: out_dim (descriptor size), recipe (the experiment config or command that made
    it), license, paper (title + arXiv id), code (origin repository), metrics (percent, as published or as
    measured by the recipe; where from goes into ``notes``), notes.

    Keys of ``metrics`` (:func:`split_metric_key`): ``"<benchmark>/R@<k>"`` for place recognition
    (``"pitts30k_test/R@1"``); ``"<benchmark>/<setup>/<metric>"`` for benchmarks scored per ground-truth
    setup, the setup one of :data:`METRIC_SETUPS` and the metric as the evaluation names it (revisited
    Oxford / Paris: ``"roxford5k/medium/mAP"``, ``"rparis6k/hard/mAP"``, ``"roxford5k/hard/mP@10"``).
    ``<benchmark>`` is the ``conf/benchmark`` name (or the set's own name); ``eval.py model=<name>`` shows
    the figures of the benchmarks it evaluates beside its own, with their difference (``published`` /
    ``delta`` columns: R@1 in the Recall@k table, mAP per setup in the mAP table).
    """

    architecture: str = ""
    tag: str = ""
    file: str | None = None
    url: str | None = None
    hf_hub_id: str | None = None
    hf_hub_filename: str | None = None
    download_page: str | None = None
    filename: str | None = None
    sha256: str | None = None
    contents: Literal["full", "delta"] = "full"
    remap: RemapFn | None = None
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)
    input_size: tuple[int, int, int] = (3, 224, 224)
    mean: tuple[float, float, float] = IMAGENET_DEFAULT_MEAN
    std: tuple[float, float, float] = IMAGENET_DEFAULT_STD
    interpolation: str = "bicubic"
    eval_resize: Literal["protocol", "pipeline"] = "protocol"
    eval_metric: Literal["ip", "l2"] = "ip"
    eval_whitening_kind: Literal["whiten", "project"] = "whiten"
    out_dim: int | None = None
    recipe: str | None = None
    license: str | None = None
    paper: str | None = None
    code: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    notes: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_kwargs", _frozen(self.model_kwargs))
        object.__setattr__(self, "metrics", _frozen(self.metrics))
        if self.contents not in ("full", "delta"):
            raise ValueError(f"PretrainedCfg.contents must be 'full' or 'delta', got {self.contents!r}")
        if self.eval_resize not in ("protocol", "pipeline"):
            raise ValueError(f"PretrainedCfg.eval_resize must be 'protocol' or 'pipeline', got {self.eval_resize!r}")
        if self.eval_metric not in ("ip", "l2"):
            raise ValueError(f"PretrainedCfg.eval_metric must be 'ip' or 'l2', got {self.eval_metric!r}")
        if self.eval_whitening_kind not in ("whiten", "project"):
            raise ValueError(f"PretrainedCfg.eval_whitening_kind must be 'whiten' or 'project', "
                             f"got {self.eval_whitening_kind!r}")
        if self.sha256 is not None and not (len(self.sha256) == 64 and set(self.sha256) <= set("0123456789abcdef")):
            raise ValueError(f"PretrainedCfg.sha256 must be 64 lowercase hex digits, got {self.sha256!r}")
        if (self.hf_hub_id is None) != (self.hf_hub_filename is None):
            raise ValueError("PretrainedCfg needs both hf_hub_id and hf_hub_filename, or neither")
        if self.download_page is not None and self.filename is None and self.url is None and self.hf_hub_id is None:
            raise ValueError("a PretrainedCfg with only a download_page needs the filename to place in the cache")

    @property
    def name(self) -> str:
        """``<architecture>.<tag>``."""
        return f"{self.architecture}.{self.tag}"

    @property
    def hf_url(self) -> str | None:
        """The file's URL on the Hub (``HF_ENDPOINT`` applies), for messages; downloads go through
        huggingface_hub (:func:`aggzoo.hub.download.fetch_weights`)."""
        if self.hf_hub_id is None or self.hf_hub_filename is None:
            return None
        return hf_hub_url(self.hf_hub_id, self.hf_hub_filename)

    @property
    def has_weights(self) -> bool:
        return any(x is not None for x in (self.file, self.url, self.hf_hub_id, self.download_page))

    @property
    def source(self) -> str:
        """Where the weights come from, in words (for tables)."""
        if self.file is not None:
            return f"weights/{self.file}"
        if self.hf_hub_id is not None:
            return f"hf-hub:{self.hf_hub_id}/{self.hf_hub_filename}"
        if self.url is not None:
            return self.url
        if self.download_page is not None:
            return f"{self.download_page} (manual download)"
        return "(no weights)"

    @property
    def remap_name(self) -> str | None:
        if self.remap is None:
            return None
        return f"{self.remap.__module__}.{self.remap.__qualname__}"

    def with_names(self, architecture: str, tag: str) -> PretrainedCfg:
        return replace(self, architecture=architecture, tag=tag)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PretrainedCfg:
        """The preprocessing and provenance fields of a :meth:`to_dict` (a saved folder's
        ``config.json``); weight sources and the remapping function are never read from a file."""
        keep = {"architecture", "tag", "model_kwargs", "input_size", "mean", "std", "interpolation", "eval_resize", "eval_metric",
                "eval_whitening_kind", "out_dim",
                "recipe", "license", "paper", "code", "metrics", "notes"}
        values = {k: v for k, v in data.items() if k in keep and v is not None}
        for key in ("input_size", "mean", "std"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (the remapping function by its dotted name)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "remap":
                value = self.remap_name
            elif isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        out["name"] = self.name
        out["source"] = self.source
        return out

