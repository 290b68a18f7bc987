"""Checks run before training or evaluation starts, so a bad combination fails in seconds with one
message instead of an hour later with a stack trace from inside a library.

- The model: built (head on backbone), then a dry forward of two random images at each configured
  image size. Failures name the backbone, the head, the size, what the backbone produced and what
  the head needs: channels, a ViT patch multiple, and what the head declares on its class
  (:class:`~aggzoo.models.heads.base.Head`): a CLS token (SALAD), aggregation tokens (ImAge),
  several levels (AFA), a fixed map size (MixVPR: the ``head.in_h``/``head.in_w`` to set), more
  local features than clusters (SALAD, n > m).
- The data: image sizes, enough training places for one batch, benchmarks with queries that have
  positives (queries without any are counted and reported, as the standard protocols count them
  as misses), duplicated file names (a dataset extracted twice), and a fast scan of the benchmark
  images (headers by default) so an unreadable file is named before any extraction starts.

Every problem found is collected and raised together as one :class:`~aggzoo.errors.PreflightError`.

The hooks :mod:`aggzoo.run.pipeline` calls around a job live here too:

- :func:`check_config`: the typed keys of the composed config (:mod:`aggzoo.run.config_schema`).
- :func:`before_training` / :func:`after_training`: the ``bad_images`` policy of the training set
  (skipped files listed in ``<run>/bad_images.tsv``), the checks above, and the report of a Ctrl-C
  stop (:class:`~aggzoo.training.interrupt.GracefulInterrupt`).
- :func:`check_evaluation` and :func:`result_notes`: the same for ``eval.py`` (:mod:`aggzoo.run.evaluate`), as
  pure functions of the model, the benchmarks and the options objects.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from aggzoo.data.image_policy import SKIPPED_LIST_NAME, ImagePolicy, scan_images
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import ConfigError, PreflightError, UserError
from aggzoo.evaluation.index import binary_refine_message, is_binary_index
from aggzoo.evaluation.metrics.recall import ks_beyond_database
from aggzoo.evaluation.options import EvaluationOptions
from aggzoo.evaluation.postprocess import rerank_metric_check
from aggzoo.evaluation.result import AT_R_METRICS
from aggzoo.evaluation.test_time import build_reranker
from aggzoo.hub.builder import build_model
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head
from aggzoo.models.modes import evaluating
from aggzoo.run.config_schema import choice_value, validate_config
from aggzoo.training.interrupt import GracefulInterrupt

__all__ = [
    "Preflight",
    "after_training",
    "before_training",
    "check_config",
    "build_model_checked",
    "image_size_problem",
    "model_problems",
    "declared_needs_problem",
    "benchmark_problems",
    "check_training",
    "check_evaluation",
    "evaluation_option_problems",
    "result_notes",
]

log = logging.getLogger(__name__)

CHECK_IMAGES_CHOICES = ("none", "header", "full")
#: The smallest image side a job accepts (1-pixel images crash the training augmentation).
MIN_IMAGE_SIDE = 8


@dataclass
class Preflight:
    """Problems (fatal, raised together) and notes (printed) found before a job starts."""

    stage: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def raise_if_any(self) -> None:
        if not self.problems:
            return
        if len(self.problems) == 1:
            raise PreflightError(f"cannot start {self.stage}: {self.problems[0]}")
        listed = "\n".join(f"  {i}. {p}" for i, p in enumerate(self.problems, start=1))
        raise PreflightError(f"cannot start {self.stage}, {len(self.problems)} problems:\n{listed}")

    def log_notes(self) -> None:
        for note in self.notes:
            log.warning("%s", note)


# -- model -----------------------------------------------------------------------------------------


def _name(module: nn.Module) -> str:
    return str(getattr(module, "model_name", None) or type(module).__name__)


def _head_name(head: Any) -> str:
    return getattr(getattr(head, "func", head), "__name__", None) or type(head).__name__


def _one_line(err: BaseException, limit: int = 700) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    text = text if isinstance(err, ValueError) else f"{type(err).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def build_model_checked(model_cfg: Mapping[str, Any]) -> nn.Module:
    """The one builder's model of ``model_cfg`` (:func:`aggzoo.hub.builder.build_model`), with a
    failure to fit the head on the backbone explained."""
    try:
        return build_model(model_cfg, where="the run config")
    except UserError:
        raise  # already says what is wrong (a target outside aggzoo, an unknown argument)
    except (ValueError, TypeError, IndexError, KeyError, RuntimeError) as err:
        backbone = model_cfg.get("backbone", {}) or {}
        head = model_cfg.get("head", {}) or {}
        raise PreflightError(
            f"cannot build head {head.get('_target_', '?')} on backbone "
            f"{backbone.get('model_name', backbone.get('_target_', '?'))}: {_one_line(err)}"
        ) from err


def image_size_problem(size: Any, key: str) -> str | None:
    """``None`` when ``size`` is ``(H, W)`` of integers of at least :data:`MIN_IMAGE_SIDE`, else the problem."""
    try:
        values = [int(v) for v in size]
        if len(values) == 2 and all(v >= MIN_IMAGE_SIDE for v in values) and all(float(v) == int(v) for v in size):
            return None
    except (TypeError, ValueError):
        pass
    shown = list(size) if isinstance(size, Sequence) and not isinstance(size, str) else size
    return (f"{key} must be [height, width] in pixels, two integers of at least {MIN_IMAGE_SIDE} (smaller images "
            f"hold no place to recognise, and the training augmentation cannot crop them), got {shown!r}; e.g. {key}=[320,320]")


def _describe_features(features: Any) -> str:
    parts = [f"maps {' '.join(str(list(m.shape[1:])) for m in features.maps)} ([C, H, W], fine to coarse)"]
    parts.append("a CLS token" if getattr(features, "cls", None) is not None else "no CLS token")
    if getattr(features, "tokens", None) is not None:
        parts.append(f"{features.tokens.shape[1]} aggregation tokens")
    return ", ".join(parts)


def _backbone_hint(backbone: nn.Module, height: int, width: int) -> str:
    patch = getattr(getattr(getattr(backbone, "model", None), "patch_embed", None), "patch_size", None)
    if patch is not None:
        ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)
        fixed = [max(ph, round(height / ph) * ph), max(pw, round(width / pw) * pw)]
        return f"This ViT needs sizes divisible by its patch size {ph}x{pw}, e.g. {fixed}."
    return "Choose another image size or backbone."


#: backbones (conf/backbone/*.yaml) that give what a head may declare it needs
_CLS_BACKBONE = "dinov2_vitb14"
_TOKENS_BACKBONE = "image_dinov2_vitb14_reg4"
_MULTILEVEL_BACKBONE = "tf_efficientnet_lite0_multilevel"


def _stride(backbone: nn.Module) -> int | None:
    info = getattr(backbone, "feature_info", None)
    return int(info[-1]["reduction"]) if info else None


def declared_needs_problem(head: Head, backbone: nn.Module, features: Features) -> str | None:
    """What ``head`` declares it needs (:class:`~aggzoo.models.heads.base.Head`) and ``features`` lack,
    said with the fix; ``None`` when the declarations are met."""
    name, source = type(head).__name__, _name(backbone)
    if head.needs_cls and features.cls is None:
        return (f"{name} needs a ViT backbone with a CLS token (features.cls); backbone {source} gives none: "
                f"use backbone={_CLS_BACKBONE} (or another timm ViT)")
    if head.needs_cls_attention and features.cls_attention is None:
        return (f"{name} reads the last block's class-token attention (features.cls_attention); backbone {source} "
                "gives none: use backbone=fol_dinov2_vitb14 (ClassAttentionViT)")
    if head.needs_tokens and features.tokens is None:
        return (f"{name} reads aggregation tokens (features.tokens); backbone {source} inserts none: "
                f"use backbone={_TOKENS_BACKBONE} (AggregationTokenViT)")
    if len(features.maps) < head.min_levels:
        return (f"{name} fuses at least {head.min_levels} backbone levels; backbone {source} gives "
                f"{len(features.maps)}: set backbone.out_indices to several levels "
                f"(e.g. backbone={_MULTILEVEL_BACKBONE})")
    height, width = features.last.shape[-2:]
    stride = _stride(backbone)
    size = head.required_map_size
    if size is not None and (height, width) != tuple(size):
        fix = (f"set {' '.join(f'head.{a}={v}' for a, v in zip(head.map_size_args or (), (height, width)))} "
               "for these images" if head.map_size_args else "build the head for this size")
        images = f", or use {size[0] * stride}x{size[1] * stride} images (stride {stride})" if stride else ""
        return f"{name} was built for {size[0]}x{size[1]} feature maps and got {height}x{width}: {fix}{images}"
    if height * width < head.min_positions:
        side = math.ceil(math.sqrt(head.min_positions))
        images = f"images of at least {side * stride}x{side * stride} (stride {stride})" if stride else "larger images"
        return (f"{name} needs at least {head.min_positions} local features (H*W of the feature map) and got "
                f"n={height * width} ({height}x{width}): use {images}, or a smaller head configuration")
    return None


@torch.no_grad()
def model_problems(model: nn.Module, image_size: Sequence[int], key: str) -> list[str]:
    """Run ``model`` on two random images of ``image_size`` (eval mode, global RNG untouched) and
    return what went wrong: the backbone refusing the size, the head refusing the backbone's
    output, a wrong descriptor shape or non-finite descriptors."""
    height, width = int(image_size[0]), int(image_size[1])
    backbone, head = model.backbone, model.head
    where = f"{height}x{width} images ({key})"
    device = next(iter(model.parameters()), torch.empty(0)).device
    images = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(0)).to(device)
    with evaluating(model):
        try:
            features = backbone(images)
        except Exception as err:  # noqa: BLE001 - any failure is reported with its context
            return [f"backbone {_name(backbone)} cannot take {where}: {_one_line(err).rstrip('.')}. "
                    f"{_backbone_hint(backbone, height, width)}"]
        produced = _describe_features(features)
        head_in = getattr(head, "in_channels", None)
        if isinstance(head_in, int) and features.last.shape[1] != head_in:
            return [f"head {type(head).__name__} was built for {head_in}-channel features but backbone "
                    f"{_name(backbone)} gives {features.last.shape[1]} channels. Build the head from the backbone "
                    "(VPRModel(backbone, head_partial) reads in_channels from feature_info) or use the backbone "
                    "the head was made for."]
        needs = declared_needs_problem(head, backbone, features) if isinstance(head, Head) else None
        if needs is not None:
            return [f"head {type(head).__name__} cannot aggregate backbone {_name(backbone)}'s output at {where}; "
                    f"the backbone gives {produced}. {needs}"]
        try:
            descriptors = head(features)
        except Exception as err:  # noqa: BLE001
            return [f"head {type(head).__name__} cannot aggregate backbone {_name(backbone)}'s output at {where}; "
                    f"the backbone gives {produced}. {_one_line(err)}"]
    out_dim = getattr(model, "out_dim", descriptors.shape[-1])
    if tuple(descriptors.shape) != (2, out_dim):
        return [f"{_name(backbone)} + {type(head).__name__} returned descriptors of shape "
                f"{tuple(descriptors.shape)} at {where}; expected [2, {out_dim}] ([B, out_dim])"]
    if not bool(torch.isfinite(descriptors).all()):
        return [f"{_name(backbone)} + {type(head).__name__} gives non-finite descriptors on random {where} "
                "before any training: check the head's initialisation and normalisation"]
    return []


# -- data ------------------------------------------------------------------------------------------


def _duplicate_names(paths: Sequence[Path]) -> list[str]:
    counts = Counter(Path(p).name for p in paths)
    return [name for name, n in counts.items() if n > 1]


def benchmark_problems(retrieval_set: RetrievalSet, *, role: str = "benchmark") -> tuple[list[str], list[str]]:
    """``(problems, notes)`` of one retrieval set."""
    problems, notes = [], []
    name = retrieval_set.name
    if retrieval_set.num_database == 0 or retrieval_set.num_queries == 0:
        problems.append(f"{role} {name!r} has {retrieval_set.num_database} database images and "
                        f"{retrieval_set.num_queries} queries; both must be non-empty (check the split and folders)")
        return problems, notes
    missing = retrieval_set.queries_without_positive
    if missing == retrieval_set.num_queries:
        problems.append(
            f"no query of {role} {name!r} has a positive database image, so every Recall@k would be 0: the "
            "ground truth does not match the images (for the VG layout: wrong positive_radius_m, or UTM "
            "coordinates in different units for queries and database)")
    elif missing:
        notes.append(f"{name}: {missing} of {retrieval_set.num_queries} queries have no positive in the ground "
                     "truth; they count as misses (Recall@k is over all queries, as in the standard protocols)")
    # A class-labelled set (metric learning) keeps its images in one folder per class, where a file name in
    # several folders is expected, not the sign of a second extraction.
    class_labelled = bool(set(retrieval_set.metrics) & set(AT_R_METRICS))
    for part, paths in (("database", retrieval_set.database_paths), ("queries", retrieval_set.query_paths)):
        duplicated = [] if class_labelled else _duplicate_names(paths)
        if duplicated:
            example = sorted(str(p) for p in paths if Path(p).name == duplicated[0])
            notes.append(f"{name}: {len(duplicated)} file names occur more than once in its {part} (e.g. "
                         f"{example}); was the dataset extracted twice? Each copy is evaluated as its own image")
    return problems, notes


_EVAL_IMAGE_FIX = ("Fix or remove them, or evaluate without them with bad_images=skip (results are then not "
                   "comparable to published numbers)")
#: in train.py ``bad_images`` (default skip) applies to the training images only, not to the benchmarks
_TRAIN_IMAGE_FIX = ("Fix or remove them, or leave the benchmark out of val_benchmarks / test_benchmarks (in train.py "
                    "bad_images applies to the training images only; eval.py bad_images=skip evaluates without them)")


def _scan_sets(sets: Mapping[str, RetrievalSet], mode: str, num_workers: int | None, fix: str = _EVAL_IMAGE_FIX) -> list[str]:
    if mode not in CHECK_IMAGES_CHOICES:
        return [f"check_images must be one of {CHECK_IMAGES_CHOICES}, got {mode!r}"]
    if mode == "none":
        return []
    problems = []
    for retrieval_set in sets.values():
        paths = retrieval_set.image_paths
        bad = scan_images(paths, full=mode == "full", num_workers=num_workers)
        if bad:
            shown = "; ".join(f"{paths[i]}: {bad[i]}" for i in sorted(bad)[:5])
            more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
            problems.append(
                f"{len(bad)} of {len(paths)} images of benchmark {retrieval_set.name!r} cannot be read: {shown}{more}. "
                f"{fix}")
    return problems


def check_training(model: nn.Module, *, train_dataset: Any, places_per_batch: int,
                   sizes: Mapping[str, Sequence[int]],
                   val_sets: Mapping[str, RetrievalSet], test_sets: Mapping[str, RetrievalSet],
                   check_images: str = "header", num_workers: int = 0) -> Preflight:
    """Everything :func:`aggzoo.run.pipeline.train` needs, checked before the Trainer starts; ``sizes``:
    ``{config key: (H, W)}`` of the training and evaluation image sizes."""
    report = Preflight("training")
    for key, size in sizes.items():
        problem = image_size_problem(size, key)
        if problem:
            report.problems.append(problem)
    if not report.problems:
        checked = []
        for key, size in sizes.items():
            if [int(v) for v in size] not in checked:
                checked.append([int(v) for v in size])
                report.problems += model_problems(model, size, key)
    if len(train_dataset) < places_per_batch:
        report.problems.append(
            f"data.places_per_batch={places_per_batch} but the training set has only {len(train_dataset)} places "
            f"with enough images; lower data.places_per_batch (e.g. data.places_per_batch={len(train_dataset)}) or "
            "use more training data")
    for role, sets in (("validation set", val_sets), ("test benchmark", test_sets)):
        for retrieval_set in sets.values():
            problems, notes = benchmark_problems(retrieval_set, role=role)
            report.problems += problems
            report.notes += notes
    report.problems += _scan_sets({**val_sets, **test_sets}, check_images, num_workers, _TRAIN_IMAGE_FIX)
    report.log_notes()
    report.raise_if_any()
    return report


def _faiss_reason(err: BaseException) -> str:
    """FAISS's own words, without the C++ function and source line it prefixes them with."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = re.sub(r"^Error in .*? at \S+:\d+: ", "", lines[-1] if lines else type(err).__name__)
    return text.replace("Error: ", "", 1)[:200]


def evaluation_option_problems(options: EvaluationOptions, out_dim: int) -> list[str]:
    """The options that would fail only after every descriptor is extracted: an index string FAISS cannot
    build for ``out_dim``-D descriptors, search parameters it does not take, a GPU index without a GPU, a
    re-ranker that cannot follow the search metric, a whitening file that is not there."""
    search = options.search
    problems = []
    try:
        import faiss
    except ImportError:  # the torch search of tiny sets needs no index string
        faiss = None
    index, params, metric = search.index, search.search_params, search.metric
    try:
        rerank_metric_check(build_reranker(options.rerank), metric)
    except ConfigError as err:
        problems.append(str(err))
    # The disk store's first stage may be a type FAISS builds for L2 only (binary ITQ/LSH codes): the
    # search layer accepts it there (index.build_index), so the probe must too; an L2 search takes them anyway.
    l2_ok = metric == "l2" or search.on_disk
    if faiss is not None and is_binary_index(index):
        # A first stage over the model's binary codes (SelaVPR++): a binary factory string, and a shortlist.
        try:
            faiss.index_binary_factory(64, index)
        except RuntimeError as err:
            problems.append(f"evaluation.search.index={index} is not a FAISS binary index string ({_faiss_reason(err)}); "
                            "e.g. evaluation.search.index=BFlat (exhaustive Hamming search)")
        if search.refine is None:
            problems.append(binary_refine_message(index))
    elif faiss is not None and isinstance(index, str):
        try:
            probe = faiss.index_factory(int(out_dim), index,
                                        faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as err:
            probe = None
            if "METRIC_L2" not in str(err):
                problems.append(f"evaluation.search.index={index} is not a FAISS index_factory string for {out_dim}-D "
                                f"descriptors ({_faiss_reason(err)}); e.g. evaluation.search.index=Flat (exact), SQfp16, "
                                "HNSW32 or IVF1024,PQ16")
            elif l2_ok:
                probe = faiss.index_factory(int(out_dim), index, faiss.METRIC_L2)
            else:
                problems.append(f"evaluation.search.index={index}: FAISS builds it with the L2 metric only, which would "
                                "rank inner products backwards; use it as the first stage of a two-stage search "
                                "(evaluation.search.refine=100 evaluation.search.refine_store=disk) or pick Flat, SQfp16, "
                                "HNSW32, IVF1024,PQ16")
        if probe is not None and params:
            try:
                faiss.ParameterSpace().set_index_parameters(probe, str(params))
            except RuntimeError as err:
                problems.append(f"evaluation.search.search_params={params} does not apply to evaluation.search.index="
                                f"{index} ({_faiss_reason(err)}); e.g. nprobe=32 for IVF indexes, efSearch=256 for HNSW, "
                                "or evaluation.search.search_params=null")
    if search.use_gpu is True and faiss is not None and faiss.get_num_gpus() == 0:
        problems.append("evaluation.search.use_gpu=true but this faiss build sees no GPU; use evaluation.search.use_gpu=null "
                        "(a GPU index when there is one) or evaluation.search.use_gpu=false")
    whitening = options.postprocess.whitening
    if whitening is not None and not Path(whitening).expanduser().is_file():
        problems.append(f"evaluation.postprocess.whitening={whitening}: no such file (a .npz written by PCA whitening, "
                        "e.g. <run>/whitening.npz); fit one instead with evaluation.postprocess.whitening_fit=<training images>")
    return problems


def check_evaluation(model: nn.Module, *, image_size: Sequence[int], sets: Mapping[str, RetrievalSet],
                     check_images: str = "header", num_workers: int | None = None,
                     options: EvaluationOptions = EvaluationOptions()) -> Preflight:
    """Everything :func:`aggzoo.run.evaluate.evaluate` needs, checked before extraction starts."""
    report = Preflight("evaluation")
    problem = image_size_problem(image_size, "image_size")
    if problem:
        report.problems.append(problem)
    else:
        report.problems += model_problems(model, image_size, "image_size")
    out_dim = getattr(model, "out_dim", None)
    if isinstance(out_dim, int):
        report.problems += evaluation_option_problems(options, out_dim)
    for retrieval_set in sets.values():
        problems, notes = benchmark_problems(retrieval_set)
        report.problems += problems
        report.notes += notes
    report.problems += _scan_sets(sets, check_images, num_workers)
    report.log_notes()
    report.raise_if_any()
    return report


def result_notes(results: Sequence[Any], bad_images_list: Path | None = None) -> list[str]:
    """Lines to print under a results table: queries without positives and skipped images."""
    lines = []
    for r in results:
        if beyond := ks_beyond_database(r.recalls, r.num_database):
            lines.append(f"note: {r.name}: recall_ks {beyond} exceed its {r.num_database} database images; R@k for "
                         f"k >= {r.num_database} counts the whole database (= R@{r.num_database}), so it says nothing "
                         "about the model")
        if r.queries_without_positive:
            lines.append(f"note: {r.name}: {r.queries_without_positive} of {r.num_queries} queries have no positive; "
                         "they count as misses (as in the standard protocols)")
        skipped_db = r.extras.get("skipped_database_images", 0)
        skipped_q = r.extras.get("skipped_queries", 0)
        if skipped_db or skipped_q:
            where = f" (listed in {bad_images_list})" if bad_images_list else ""
            lines.append(f"note: {r.name}: evaluated without {skipped_db} database images and {skipped_q} queries "
                         f"that could not be read{where}; not comparable to published numbers")
    return lines


# -- hooks -----------------------------------------------------------------------------------------



def check_config(cfg: DictConfig, kind: str) -> None:
    """Raise one :class:`~aggzoo.errors.ConfigError` naming a config key whose value has the wrong
    type or cannot work, or an accelerator this machine does not have."""
    validate_config(cfg, kind)
    if kind == "train":  # before the training augmentation is built: albumentations fails on [0, 0] with its traceback
        for key in ("data.image_size", "data.eval_image_size"):
            size = OmegaConf.select(cfg, key, default=None)
            if size is not None and (problem := image_size_problem(size, key)):
                raise ConfigError(problem)
    accelerator = str(cfg.get("trainer", {}).get("accelerator", "auto")) if kind == "train" else "auto"
    available = {"gpu": torch.cuda.is_available, "cuda": torch.cuda.is_available,
                 "mps": lambda: torch.backends.mps.is_available()}
    if accelerator in available and not available[accelerator]():
        device = "Apple MPS device" if accelerator == "mps" else "CUDA GPU"
        raise ConfigError(
            f"trainer.accelerator={accelerator} but this machine has no {device} that PyTorch can use; train on the "
            "CPU with trainer.accelerator=cpu, or use trainer.accelerator=auto (a GPU when there is one, else the CPU)")


def before_training(cfg: DictConfig, parts: Any) -> ImagePolicy:
    """Give the training set its ``bad_images`` policy and run the preflight checks.

    ``parts`` is :class:`aggzoo.run.pipeline.TrainingParts` (``model``, ``datamodule``, ``test_sets``).
    """
    policy = ImagePolicy(
        on_error=choice_value(cfg.get("bad_images", "skip")), log_path=Path(cfg.paths.output_dir) / SKIPPED_LIST_NAME,
        hint="Fix or remove the file, or skip unreadable training images with bad_images=skip")
    dataset = parts.datamodule.train_dataset
    if hasattr(dataset, "bad_images"):
        dataset.bad_images = policy
    check_training(parts.model, train_dataset=dataset, places_per_batch=int(cfg.data.places_per_batch),
                   sizes={"data.image_size": cfg.data.image_size, "data.eval_image_size": cfg.data.eval_image_size},
                   val_sets=parts.datamodule.val_sets, test_sets=parts.test_sets,
                   check_images=choice_value(cfg.get("check_images", "header")), num_workers=int(cfg.data.num_workers))
    return policy


def after_training(trainer: Any, policy: ImagePolicy) -> dict[str, Any]:
    """``{"interrupted": checkpoint}`` after a Ctrl-C stop, ``{"bad_images": {path: reason}}`` when
    training images were skipped; prints what happened."""
    out: dict[str, Any] = {}
    skipped = policy.finalize()
    if skipped:
        groups = [k for k in skipped if k.startswith(("place:", "class:"))]  # training items, not files
        files = len(skipped) - len(groups)
        kind = "classes" if groups and all(k.startswith("class:") for k in groups) else "places"
        dropped = f" and replaced {len(groups)} {kind} left with too few readable images" if groups else ""
        print(f"note: skipped {files} unreadable training images{dropped}; listed in {policy.log_path}")
        out["bad_images"] = skipped
    interrupt = next((c for c in trainer.callbacks if isinstance(c, GracefulInterrupt) and c.saved_path), None)
    if interrupt is not None:
        print(f"interrupted at global step {trainer.global_step}: saved {interrupt.saved_path}; no test evaluation. "
              f"Resume with ckpt_path={interrupt.saved_path}")
        out["interrupted"] = str(interrupt.saved_path)
    return out
