"""``evaluate(cfg)``: the evaluation job, ``python eval.py ...``, in one place.

1. the model: named (``model=``: a zoo name, a checkpoint, a run folder, ``local-dir:`` / ``hf-hub:``), by
   checkpoint (``ckpt_path=``), or the config's untrained backbone + head (:mod:`aggzoo.run.model_by_name`);
2. its protocol (:func:`evaluation_protocol`): the weights' own, every field overridable
   (``evaluation.protocol.*``);
3. the options (:func:`aggzoo.run.evaluation_options.evaluation_options`), built once;
4. either the unlabelled mode (``database=`` / ``queries=``: top-k predictions, no ground truth), or the
   benchmarks: loaded (:func:`load_benchmarks`), checked before any extraction (:func:`prepare_benchmarks`: pure
   functions of the model, the sets and the options), evaluated (extraction sharded across ranks with
   ``trainer=ddp``), reported.
"""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from torch import nn

from aggzoo.data.image_policy import SKIPPED_LIST_NAME, ImagePolicy, drop_unreadable
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import ConfigError, ImageReadError
from aggzoo.evaluation.benchmarks import evaluate_benchmarks
from aggzoo.evaluation.options import EvaluationOptions
from aggzoo.evaluation.protocol import EvalProtocol
from aggzoo.evaluation.report import format_table, write_json
from aggzoo.evaluation.result import RetrievalResult
from aggzoo.evaluation.unlabelled import Predictions, image_folder, predict, readable_images, write_predictions
from aggzoo.hub.cfg import PretrainedCfg, split_metric_key
from aggzoo.models.input_size import size_multiple
from aggzoo.run.benchmark_config import load_benchmark, load_benchmarks
from aggzoo.run.config_schema import choice_value
from aggzoo.run.evaluation_options import descriptor_cache, evaluation_options, whitening_fit_source
from aggzoo.run.model_by_name import command_line_keys, load_model_to_evaluate, model_spec, normalisation
from aggzoo.run.preflight import build_model_checked, check_config, check_evaluation, result_notes
from aggzoo.training.sharded_extraction import ShardedExtractor

__all__ = ["PROTOCOL_KEYS", "ImageChecks", "comparable_published", "evaluate", "evaluation_protocol",
           "prepare_benchmarks", "preflight_size", "run_unlabelled", "untrained_note"]

log = logging.getLogger(__name__)

#: ``evaluation.protocol.<key>`` (``evaluation.search.metric``, ``evaluation.postprocess.whitening_kind``) ->
#: :class:`EvalProtocol` field (null: the model's own value)
PROTOCOL_KEYS = {"protocol.image_size": "image_size", "protocol.side": "side", "protocol.resize": "resize",
                 "protocol.interpolation": "interpolation", "protocol.mean": "mean", "protocol.std": "std",
                 "protocol.descriptor_dim": "descriptor_dim", "search.metric": "metric",
                 "postprocess.whitening_kind": "whitening_kind", "protocol.multiple": "multiple"}


# -- the model and its protocol --------------------------------------------------------------------


def untrained_note(model: torch.nn.Module) -> str:
    """What eval.py says when it is given no ``ckpt_path``: the model it evaluates is untrained."""
    head = type(getattr(model, "head", model)).__name__
    return (f"note: no ckpt_path given (nor model=), so this evaluates an untrained {head} head on the configured "
            "backbone (its pretrained weights, if any; the head as initialised, with no data-driven init). To evaluate "
            "trained weights pass model=<zoo name, checkpoint, run folder or save_pretrained folder> (or "
            "ckpt_path=<checkpoint, run folder or zoo name>).")


def evaluation_protocol(model: nn.Module, cfg: DictConfig, pretrained_cfg: PretrainedCfg | None,
                        norm: dict[str, Any]) -> EvalProtocol:
    """The protocol ``model`` is evaluated with: its weights' cfg (or, without one, ``image_size`` with
    the pipeline resize and ``norm``), with every non-null ``evaluation.<key>`` of :data:`PROTOCOL_KEYS`
    applied; ``image_size=`` given on the command line counts as ``evaluation.protocol.image_size``."""
    multiple = size_multiple(model)
    if pretrained_cfg is not None:
        base = EvalProtocol.from_pretrained_cfg(pretrained_cfg, multiple=multiple)
    else:
        base = EvalProtocol(image_size=tuple(int(s) for s in cfg.image_size), resize="pipeline",
                            mean=tuple(norm["mean"]), std=tuple(norm["std"]), multiple=multiple,
                            source="the config (image_size, the backbone's normalisation): the model states no protocol")
    overrides = {field: OmegaConf.select(cfg, f"evaluation.{key}", default=None) for key, field in PROTOCOL_KEYS.items()}
    overrides = {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v for k, v in overrides.items()}
    if overrides["resize"] is not None:
        overrides["resize"] = "protocol" if overrides["resize"] else "pipeline"
    if overrides["image_size"] is None and pretrained_cfg is not None and "image_size" in command_line_keys():
        overrides["image_size"] = OmegaConf.to_container(cfg.image_size) if not isinstance(cfg.image_size, int) \
            else cfg.image_size
    protocol = base.overridden_by(overrides)
    out_dim = getattr(model, "out_dim", None)
    if protocol.descriptor_dim is not None and isinstance(out_dim, int) and out_dim != protocol.descriptor_dim:
        where = "evaluation.protocol.descriptor_dim" if "descriptor_dim" in protocol.overridden else protocol.source
        raise ConfigError(f"the model gives {out_dim}-D descriptors but {where} states {protocol.descriptor_dim}; "
                          "evaluate the weights the protocol was written for, or set evaluation.protocol.descriptor_dim=null")
    if protocol.descriptor_dim is None and isinstance(out_dim, int):
        protocol = replace(protocol, descriptor_dim=out_dim)
    return protocol


def preflight_size(protocol: EvalProtocol, sets: Mapping[str, RetrievalSet]) -> tuple[int, int]:
    """The ``(H, W)`` the preflight runs the model at: the protocol's, or under a short side the size
    the first database image is resized to (its header read, not its pixels)."""
    if protocol.fixed_size:
        return protocol.output_size(0, 0)
    first = next((s.database_paths[0] for s in sets.values() if s.database_paths), None)
    if first is None:
        return protocol.output_size(int(protocol.image_size), int(protocol.image_size))
    with Image.open(first) as image:
        width, height = image.size
    return protocol.output_size(height, width)


# -- benchmarks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageChecks:
    """How a job treats the benchmark images before extraction (``bad_images``, ``check_images``, ``num_workers``)."""

    bad_images: str = "fail"
    check_images: str = "header"
    num_workers: int | None = None
    log_dir: Path | None = None

    def policy(self) -> ImagePolicy:
        return ImagePolicy(
            on_error=self.bad_images, log_path=(self.log_dir or Path(".")) / SKIPPED_LIST_NAME,
            hint="A benchmark with a missing image is not that benchmark: fix or re-download the file, or "
                 "evaluate without unreadable images with bad_images=skip (not comparable to published numbers)")


def prepare_benchmarks(model: nn.Module, sets: Mapping[str, RetrievalSet], size: tuple[int, int],
                       options: EvaluationOptions, checks: ImageChecks,
                       policy: ImagePolicy) -> tuple[dict[str, RetrievalSet], dict[str, dict[str, int]]]:
    """Check everything before any extraction (the model at ``size``, the search options, the sets and their
    images), then under ``bad_images=skip`` drop each set's unreadable images: ``(sets, skipped counts by name)``."""
    # Under skip every image is decoded below anyway; the header scan would only repeat it.
    scan = "none" if policy.skips else checks.check_images
    check_evaluation(model, image_size=size, sets=sets, check_images=scan, num_workers=checks.num_workers,
                     options=options)
    if not policy.skips:
        return dict(sets), {}
    out, skipped = {}, {}
    for name, retrieval_set in sets.items():
        out[name], counts = drop_unreadable(retrieval_set, policy, num_workers=checks.num_workers)
        if any(counts.values()):
            skipped[out[name].name] = counts
    return out, skipped


def _sharded_extractor(cfg: DictConfig, options: EvaluationOptions) -> tuple[ShardedExtractor | None, Path | None]:
    """``trainer=ddp`` (or any ``trainer`` node): extraction through Lightning's predict loop on every rank,
    shards under ``evaluation.search.store_dir`` (kept) or ``<run>/descriptor_shards`` (removed afterwards)."""
    if cfg.get("trainer") is None:
        return None, None
    store = options.search.store_dir
    if store and options.rerank.method == "instance_tokens":
        # The token pass is not sharded: every rank would write the same token files under store_dir at once.
        raise ConfigError("evaluation.rerank.method=instance_tokens with a trainer (distributed extraction) needs "
                          "evaluation.search.store_dir=null: each rank then keeps its token files in its own temporary folder")
    folder = Path(store) if store else Path(cfg.paths.output_dir) / "descriptor_shards"
    trainer_factory = instantiate(cfg.trainer, _partial_=True)
    return ShardedExtractor(trainer_factory, folder), None if store else folder


#: command-line keys that move a benchmark's files away from the ones its published figures were measured on
_MOVED_DATA = ("paths.data_root", "paths.shared_data")


def comparable_published(published: Mapping[str, float] | None, sets: Mapping[str, RetrievalSet],
                         overridden: set[str]) -> dict[str, float]:
    """The published figures (``"<benchmark>/R@<k>"``, ``"<benchmark>/<setup>/<metric>"`` -> percent:
    :func:`~aggzoo.hub.cfg.split_metric_key`) that apply to ``sets`` as loaded: those of a
    benchmark whose files were moved on the command line (``benchmark.<name>.*``, ``paths.data_root``,
    ``paths.shared_data``) are another dataset's, so they are dropped, with a note saying why."""
    if not published:
        return {}
    kept = dict(published)
    for name, retrieval_set in sets.items():
        moved = sorted(k for k in overridden if k.startswith(f"benchmark.{name}.") or k in _MOVED_DATA)
        figures = [key for key in published if split_metric_key(key)[0] in (name, retrieval_set.name)]
        if moved and figures:
            for key in figures:
                kept.pop(key, None)
            print(f"note: {name}: the model's published figures are not shown: {', '.join(moved)} points the benchmark "
                  "at other files than the ones they were measured on")
    return kept


# -- the job ---------------------------------------------------------------------------------------



def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def evaluate(cfg: DictConfig) -> list[RetrievalResult]:
    """Evaluate ``cfg.model`` / ``cfg.ckpt_path`` (or ``cfg.backbone`` + ``cfg.head`` untrained when
    both are null) on every benchmark in ``cfg.benchmark``: prints a table and writes ``results.json``,
    ``results.md``, metric curves and retrieval grids to the output dir. With ``database=`` /
    ``queries=`` folders and no ground truth it writes the top-k predictions instead (returns ``[]``).

    The protocol (input size or short side, resize rule, mean/std, descriptor size) is the weights' own
    (their :class:`~aggzoo.hub.cfg.PretrainedCfg`), else ``image_size`` with the pipeline's resize (the
    one the training pipeline validates and tests with, so both report the same numbers); every field
    can be overridden (``evaluation.protocol.image_size``, ``evaluation.protocol.resize``, ...: conf/eval.yaml).
    """
    check_config(cfg, "eval")
    named = load_model_to_evaluate(cfg)  # the one reader and builder: nothing in a file chooses code to run
    if named is not None:
        model = named.model
    else:
        model = build_model_checked(model_spec(cfg))
        print(untrained_note(model))
    protocol = evaluation_protocol(model, cfg, named.pretrained_cfg if named else None, normalisation(model))
    meta = {"ckpt_path": cfg.get("ckpt_path"),
            **(named.meta(protocol) if named is not None else {"model": None, "protocol": protocol.to_dict()})}
    log.info("protocol: %s (from %s%s)", protocol.describe(), protocol.source,
             f"; overridden: {', '.join(protocol.overridden)}" if protocol.overridden else "")
    device = _device()
    batch_size = int(cfg.eval_batch_size) if protocol.fixed_size else 1  # images keep their own sizes otherwise
    options = evaluation_options(cfg, metric=protocol.metric, whitening_kind=protocol.whitening_kind,
                                 whitening_source=whitening_fit_source(cfg, load_benchmark))
    options = replace(options, extraction=replace(options.extraction, batch_size=batch_size, device=str(device)),
                      test_time=replace(options.test_time, multiple=protocol.multiple))
    if cfg.get("database") or cfg.get("queries"):
        run_unlabelled(cfg, model, protocol, options, meta)
        return []
    sets = load_benchmarks(cfg.benchmark)  # check_config refused an empty selection
    checks = ImageChecks(bad_images=choice_value(cfg.get("bad_images", "fail")),
                         check_images=choice_value(cfg.get("check_images", "header")),
                         num_workers=cfg.get("num_workers"), log_dir=Path(cfg.paths.output_dir))
    policy = checks.policy()
    sets, skipped = prepare_benchmarks(model, sets, preflight_size(protocol, sets), options, checks, policy)
    extractor, shards = _sharded_extractor(cfg, options)
    # Under trainer=ddp every rank runs this job; rank 0 alone writes the report and prints.
    writer = extractor is None or extractor.is_global_zero
    if not writer:
        options = replace(options, outputs=replace(options.outputs, dir=None, pictures=False))
    published = comparable_published(named.pretrained_cfg.metrics if named and named.pretrained_cfg else None,
                                     sets, command_line_keys())
    try:
        results = evaluate_benchmarks(model.to(device), sets, protocol.transform(), options, meta=meta,
                                      published=published, extractor=extractor, cache=descriptor_cache(options))
    finally:
        if shards is not None and writer:
            shutil.rmtree(shards, ignore_errors=True)
    if not writer:
        return results
    for result in results:  # the skipped-image counts reach the JSON through extras
        result.extras.update(skipped.get(result.name, {}))
    print(format_table(results))
    notes = result_notes(results, policy.log_path if policy.finalize() else None)
    if notes:
        print("\n".join(notes))
    if skipped:
        write_json(results, Path(cfg.paths.output_dir) / "results.json", meta=meta)
    return results


# -- without ground truth --------------------------------------------------------------------------


def run_unlabelled(cfg: DictConfig, model: nn.Module, protocol: EvalProtocol, options: EvaluationOptions,
                   meta: dict[str, Any]) -> Predictions:
    """Top-``top_k`` of every image of ``queries=`` among ``database=`` (no ground truth), written to
    the run folder as ``predictions.csv`` / ``.json`` / ``.png``. A query whose own file is in the database is
    reported loudly (``self_matches=report``) or searched without it (``exclude``); ``bad_images=skip`` leaves
    unreadable files of both folders out."""
    if "benchmark" in command_line_keys():
        raise ConfigError("benchmark= and database=/queries= are two evaluations: a benchmark has ground truth, the "
                          "folders have none (their top-k predictions are written); give one of them")
    database = image_folder(cfg.get("database"), "database")
    queries = image_folder(cfg.get("queries"), "queries")
    progress = options.extraction.progress
    skipped_note = ""
    if choice_value(cfg.get("bad_images", "fail")) == "skip":  # unreadable files leave both folders' lists
        policy = ImagePolicy("skip", log_path=Path(cfg.paths.output_dir) / SKIPPED_LIST_NAME)
        database = readable_images(database, policy, num_workers=cfg.num_workers, progress=progress)
        queries = readable_images(queries, policy, num_workers=cfg.num_workers, progress=progress)
        if not database or not queries:
            raise ImageReadError(f"bad_images=skip: no readable image left in {'database' if not database else 'queries'}"
                                 f"={cfg.database if not database else cfg.queries} (the unreadable ones are listed in "
                                 f"{policy.log_path})")
        if skipped := policy.finalize():
            skipped_note = f"note: skipped {len(skipped)} unreadable images (bad_images=skip); listed in {policy.log_path}"
    device = options.extraction.torch_device
    predictions = predict(model.to(device), database, queries, protocol.transform(), options, k=int(cfg.top_k),
                          self_matches=choice_value(cfg.get("self_matches", "report")))
    outputs = options.outputs
    # the picture shows the top_k asked for, unless its own width is given
    grid_k = int(outputs.grid_k) if "evaluation.outputs.grid_k" in command_line_keys() else int(cfg.top_k)
    files = write_predictions(predictions, cfg.paths.output_dir,
                              meta={**meta, "database": str(cfg.database), "queries": str(cfg.queries)},
                              picture=bool(outputs.pictures), grid_queries=int(outputs.grid_queries), grid_k=grid_k)
    if skipped_note:
        print(skipped_note)
    summary = predictions.summary()
    found = summary["queries_that_found_their_own_file"]
    if found:  # a query finding its own file says nothing about the model: never a plain success line
        print(f"warning: {found} of {len(queries)} queries found their own image file among the database images "
              f"({summary['queries_whose_top1_is_their_own_file']} of them at top-1): queries={cfg.queries} and "
              f"database={cfg.database} share {summary['queries_in_database']} files. The figures below count those "
              "self-matches; search each query without its own file with self_matches=exclude, or give a query "
              "folder outside the database folder", file=sys.stderr)
    distance = (f"; top-1 median {summary['median_top1_distance_m']:.1f} m from the query (file-name coordinates), "
                f"{100 * summary['top1_within_25m']:.1f} % within 25 m" if predictions.distances_m is not None else "")
    if found:
        distance += f" (counting {found} queries that found their own file: not a measure of the model)"
    elif summary["queries_in_database"]:
        distance += f" ({summary['queries_in_database']} queries searched without their own file: self_matches=exclude)"
    print(f"{len(queries)} queries x {len(database)} database images, top-{summary['k']} written to "
          f"{files['csv']} and {files['json']}{distance}")
    return predictions
