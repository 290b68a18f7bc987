"""Typed schemas of the top-level ``train.yaml`` / ``eval.yaml`` keys (Hydra structured configs).

Hydra already rejects a misspelt key (``trainer.max_epoch=3``, ``evaluate_baselin=false``): the
composed config is in struct mode, so only ``+key=value`` adds a key. What it cannot catch without a
schema is a wrong *type*: ``evaluate_baseline=maybe`` would be a truthy string, ``seed=abc`` would
fail deep inside Lightning. The dataclasses below type the scalar keys; the config groups
(``backbone``, ``head``, ``trainer``, ...) stay free-form (``Any``) because their keys are the
constructor arguments of their ``_target_``.

The schemas are registered in Hydra's ConfigStore as ``aggzoo_schema/train`` and
``aggzoo_schema/eval`` (package ``_global_``) and listed first in the defaults of ``train.yaml`` and
``eval.yaml`` as ``optional``: a bad override then fails at composition, naming the key. The schema
nodes are not in struct mode themselves, so a key added to a YAML file without a schema entry still
composes; only typed keys are checked. :func:`validate_config` applies the same schema to an
already composed config (the pipeline calls it, so configs composed without the registration are
checked too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aggzoo.errors import ConfigError

__all__ = ["BadImages", "CheckImages", "SelfMatches", "choice_value", "TrainSchema", "EvalSchema", "register_schemas",
           "validate_config", "value_problems"]

SCHEMA_GROUP = "aggzoo_schema"




class BadImages(str, Enum):
    """What to do with an unreadable image: stop (``fail``) or skip and list it (``skip``)."""

    fail = "fail"
    skip = "skip"


class SelfMatches(str, Enum):
    """Without ground truth, a query whose own file is in the database: keep it and say so (``report``),
    or search without it (``exclude``)."""

    report = "report"
    exclude = "exclude"


class CheckImages(str, Enum):
    """How the benchmark images are scanned before a job starts."""

    none = "none"
    header = "header"
    full = "full"


@dataclass
class DataSchema:
    places_per_batch: int = 32
    image_size: list[int] = field(default_factory=lambda: [320, 320])
    eval_image_size: list[int] = field(default_factory=lambda: [320, 320])
    augment_strength: float = 1.0
    num_workers: int = 0
    train: Any = None


@dataclass
class TrainerSchema:
    max_epochs: int = 1


@dataclass
class TrainSchema:
    """The typed top-level keys of ``conf/train.yaml``."""

    task_name: str = "train"
    seed: int = 0
    ckpt_path: str | None = None
    evaluate_baseline: bool = True
    recall_ks: list[int] = field(default_factory=lambda: [1, 5, 10, 20])
    eval_batch_size: int = 64
    num_workers: int = 0
    bad_images: BadImages = BadImages.skip
    check_images: CheckImages = CheckImages.header


@dataclass
class _TrainRuntimeSchema(TrainSchema):
    # Nested typed nodes are checked by validate_config only: inside Hydra's composition a nested
    # dataclass node would reject the keys its group YAML adds (trainer._target_, ...).
    data: DataSchema = field(default_factory=DataSchema)
    trainer: TrainerSchema = field(default_factory=TrainerSchema)


@dataclass
class EvalSchema:
    """The typed top-level keys of ``conf/eval.yaml``."""

    task_name: str = "eval"
    model: str | None = None
    ckpt_path: str | None = None
    database: str | None = None
    queries: str | None = None
    top_k: int = 10
    self_matches: SelfMatches = SelfMatches.report
    image_size: list[int] = field(default_factory=lambda: [320, 320])
    recall_ks: list[int] = field(default_factory=lambda: [1, 5, 10, 20])
    eval_batch_size: int = 64
    num_workers: int | None = None
    bad_images: BadImages = BadImages.fail
    check_images: CheckImages = CheckImages.header


_SCHEMAS = {"train": TrainSchema, "eval": EvalSchema}
_RUNTIME_SCHEMAS = {"train": _TrainRuntimeSchema, "eval": EvalSchema}


def choice_value(value: Any) -> str:
    """A typed choice of these schemas (``BadImages.skip``, a str Enum) or a plain string, as its string value."""
    return str(getattr(value, "value", value))


def _lenient(schema: type) -> DictConfig:
    """The schema as a config whose typed keys are checked and whose unknown keys are accepted."""
    node = OmegaConf.structured(schema)
    stack = [node]
    while stack:
        current = stack.pop()
        OmegaConf.set_struct(current, False)
        stack += [c for k in current if isinstance(c := current._get_node(k), DictConfig)]
    return node


def register_schemas() -> None:
    """Store the schemas in Hydra's ConfigStore (``aggzoo_schema/train``, ``aggzoo_schema/eval``)."""
    store = ConfigStore.instance()
    for name, schema in _SCHEMAS.items():
        store.store(group=SCHEMA_GROUP, name=name, node=_lenient(schema), package="_global_")


def validate_config(cfg: DictConfig, kind: str) -> None:
    """Check the typed keys of a composed ``train`` / ``eval`` config; raises one
    :class:`ConfigError` naming the key, the value and the expected type."""
    node = _lenient(_RUNTIME_SCHEMAS[kind])
    try:
        # As plain data: a config composed on top of the registered schema is typed TrainSchema,
        # which OmegaConf would not merge into the (unrelated) runtime schema.
        OmegaConf.merge(node, OmegaConf.to_container(cfg, resolve=False, enum_to_str=True))
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        reason = " ".join(str(getattr(err, "msg", err)).split("full_key:")[0].split())
        raise ConfigError(f"config key {key!r}: {reason}. Fix the override or the YAML "
                         f"(see conf/{kind}.yaml and aggzoo/run/config_schema.py for the expected types)") from None
    problems = value_problems(cfg, kind)
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else
                          f"{len(problems)} config values are out of range:\n" +
                          "\n".join(f"  {i}. {p}" for i, p in enumerate(problems, start=1)))


#: Integer keys with a lower bound: key -> (minimum, why, a working override).
_MINIMA: dict[str, dict[str, tuple[int, str, str]]] = {
    "train": {
        "data.places_per_batch": (2, "each batch needs two places or more (a place's negatives are the "
                                  "other places of its batch)", "data.places_per_batch=32"),
        "eval_batch_size": (1, "it is the number of images per extraction batch", "eval_batch_size=64"),
        "num_workers": (0, "it counts DataLoader worker processes, 0 loads in the main process", "num_workers=0"),
        "data.num_workers": (0, "it counts DataLoader worker processes, 0 loads in the main process", "data.num_workers=4"),
    },
    "eval": {
        "eval_batch_size": (1, "it is the number of images per extraction batch", "eval_batch_size=64"),
        "top_k": (1, "it is the number of database images listed per query without ground truth", "top_k=10"),
        "num_workers": (0, "it counts DataLoader worker processes, 0 loads in the main process", "num_workers=4"),
    },
}


def value_problems(cfg: DictConfig, kind: str) -> list[str]:
    """Values of the right type that cannot work (a batch of 0 places, Recall@0, no benchmark), one
    line each naming the key and a working override. Keys the config lacks are skipped."""
    problems = []
    for key, (minimum, why, example) in _MINIMA[kind].items():
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        if isinstance(value, int) and not isinstance(value, bool) and value < minimum:
            problems.append(f"{key}={value} must be at least {minimum}: {why}; e.g. {example}")
    ks = OmegaConf.select(cfg, "recall_ks", default=None, throw_on_missing=False)
    if ks is not None:
        ks = list(ks)
        if not ks or any(not isinstance(k, int) or k < 1 for k in ks):
            problems.append(f"recall_ks={ks} must be a non-empty list of k >= 1 (Recall@k counts the top k "
                            "database images); e.g. recall_ks=[1,5,10,20]")
    if kind == "eval" and not cfg.get("benchmark"):
        problems.append("no benchmark selected: pass benchmark=<name> or benchmark=[a,b] (the names of conf/benchmark/)")
    return problems


register_schemas()
