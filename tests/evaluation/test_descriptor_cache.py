"""The descriptor cache: the +1M distractors (or a whole database without them) are extracted once per model,
protocol and image list, reused by a second evaluation and by another benchmark sharing the list, and
never trusted when the file on disk is damaged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from revisitop_files import write_r1m, write_revisitop
from torch import nn

from aggzoo.data.revisitop import load_revisitop
from aggzoo.data.transforms import eval_transform
from aggzoo.errors import ConfigError
from aggzoo.evaluation.descriptor_cache import DescriptorCache, model_digest
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.loop import Stages, evaluate_retrieval
from aggzoo.evaluation.options import (
    EvaluationOptions,
    ExtractionOptions,
    OutputOptions,
    SearchOptions,
    TestTimeOptions,
)
from aggzoo.run.evaluation_options import descriptor_cache

DISTRACTORS = ["0/00/distractor_a", "0/00/distractor_b", "0/01/distractor_c", "0/01/distractor_d", "0/02/distractor_e"]
OPTIONS = EvaluationOptions(extraction=ExtractionOptions(batch_size=4, num_workers=0, progress=False),
                            outputs=OutputOptions(save_descriptors=True))


class TinyNet(nn.Module):
    """A real (small) network: conv -> ReLU -> mean pool -> L2; it counts the images it is given."""

    def __init__(self, seed: int = 0, width: int = 8) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(3, width, 3, stride=2)
        self.images: list[int] = []
        self.register_forward_pre_hook(lambda _, args: self.images.append(len(args[0])))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.conv(x).relu().mean((2, 3)) + 1e-3, dim=1)


class WiderNet(TinyNet):
    def __init__(self) -> None:
        super().__init__(width=12)


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    write_revisitop(tmp_path / "roxford5k")
    write_revisitop(tmp_path / "rparis6k", dataset="rparis6k")
    write_r1m(tmp_path / "revisitop1m", DISTRACTORS)
    return tmp_path


TRANSFORM = eval_transform((32, 32))


def _evaluate(model: TinyNet, retrieval_set, cache: DescriptorCache, options: EvaluationOptions = OPTIONS):
    model.images.clear()
    result = evaluate_retrieval(model, retrieval_set, TRANSFORM, options, Stages(cache=cache))
    return result, sum(model.images)


@pytest.mark.parametrize("search", [SearchOptions(), SearchOptions(index="Flat", refine=4, refine_store="disk")],
                         ids=["ram", "disk-store"])
def test_a_second_evaluation_reuses_the_cached_distractors(data: Path, tmp_path: Path, search: SearchOptions) -> None:
    cache = DescriptorCache(tmp_path / "cache")
    options = EvaluationOptions(extraction=OPTIONS.extraction, outputs=OPTIONS.outputs, search=search)
    oxford = load_revisitop(data / "roxford5k", distractors=data / "revisitop1m")
    assert oxford.distractors == len(DISTRACTORS) and oxford.num_database == 8 + len(DISTRACTORS)
    model = TinyNet()
    first, images = _evaluate(model, oxford, cache, options)
    assert images == 8 + 3 + len(DISTRACTORS)
    (entry,) = sorted((tmp_path / "cache").glob("*.npy"))
    # the cached rows are the distractors' descriptors, extracted directly here
    direct = extract_descriptors(model, oxford.database_paths[8:], TRANSFORM, OPTIONS.extraction)
    assert np.array_equal(np.load(entry), direct)
    second, images = _evaluate(model, oxford, cache, options)
    assert images == 8 + 3  # the benchmark's own images and queries only
    assert second.metrics == first.metrics
    assert np.array_equal(np.asarray(second.database_descriptors), np.asarray(first.database_descriptors))
    # another benchmark with the same R1M list shares the entry
    paris = load_revisitop(data / "rparis6k", dataset="rparis6k", distractors=data / "revisitop1m")
    result, images = _evaluate(model, paris, cache, options)
    assert images == 8 + 3 and sorted((tmp_path / "cache").glob("*.npy")) == [entry]
    assert np.array_equal(np.asarray(result.database_descriptors)[8:], direct)


def test_without_distractors_the_whole_database_is_cached(data: Path, tmp_path: Path) -> None:
    cache = DescriptorCache(tmp_path / "cache")
    oxford = load_revisitop(data / "roxford5k")
    model = TinyNet()
    first, images = _evaluate(model, oxford, cache)
    assert images == 8 + 3
    second, images = _evaluate(model, oxford, cache)
    assert images == 3  # queries only
    assert second.metrics == first.metrics


def _changed_weight(model: TinyNet) -> TinyNet:
    with torch.no_grad():
        model.conv.bias[0] += 0.5
    return model


@pytest.mark.parametrize("change", ["model", "weights", "protocol", "paths", "dtype", "scales"])
def test_anything_that_changes_the_descriptors_misses(data: Path, tmp_path: Path, change: str) -> None:
    cache = DescriptorCache(tmp_path / "cache")
    paths = load_revisitop(data / "roxford5k", distractors=data / "revisitop1m").database_paths[8:]
    model = TinyNet()
    cache.descriptors(extract_descriptors, model, paths, TRANSFORM, OPTIONS)
    other, transform, options = TinyNet(), TRANSFORM, OPTIONS
    if change == "model":
        other = WiderNet()
    elif change == "weights":
        other = _changed_weight(TinyNet())
        assert model_digest(other) != model_digest(model)
    elif change == "protocol":
        transform = eval_transform((40, 40))
    elif change == "paths":
        paths = paths[:-1]
    elif change == "dtype":
        options = EvaluationOptions(extraction=ExtractionOptions(batch_size=4, num_workers=0, progress=False,
                                                                 descriptor_dtype="float16"))
    elif change == "scales":  # a test-time option: the same weights, other descriptors
        options = EvaluationOptions(extraction=OPTIONS.extraction, test_time=TestTimeOptions(scales=(1.0, 0.5)))
    other.images.clear()
    out = cache.descriptors(extract_descriptors, other, paths, transform, options)
    assert sum(other.images) == len(paths)  # extracted again, not read from the first entry
    assert np.array_equal(out, extract_descriptors(other, paths, transform, options.extraction))
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 2
    # and the same model, weights, protocol and paths as the first still hit
    again = TinyNet()
    cache.descriptors(extract_descriptors, again, load_revisitop(data / "roxford5k", distractors=data / "revisitop1m")
                      .database_paths[8:], TRANSFORM, OPTIONS)
    assert again.images == []


def test_the_digest_is_of_the_weights_not_the_object() -> None:
    assert model_digest(TinyNet(seed=3)) == model_digest(TinyNet(seed=3))
    assert model_digest(TinyNet(seed=3)) != model_digest(TinyNet(seed=4))


class _Marker:
    """An object whose unpickling would create a file (what a malicious cache entry could try)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _damage(entry: Path, how: str, marker: Path) -> None:
    raw = entry.read_bytes()
    if how == "truncated":
        entry.write_bytes(raw[: len(raw) - 7])
    elif how == "flipped byte":  # a valid header, other numbers
        entry.write_bytes(raw[:-3] + bytes([raw[-3] ^ 0xFF]) + raw[-2:])
    elif how == "garbage":
        entry.write_bytes(b"not an npy file at all")
    elif how == "pickled objects":  # the header says object dtype: loading it would unpickle
        array = np.empty(len(DISTRACTORS), dtype=object)
        array[:] = [_Marker(marker)] * len(DISTRACTORS)
        with entry.open("wb") as file:
            np.save(file, array, allow_pickle=True)
    elif how == "wrong shape":
        np.save(entry, np.zeros((len(DISTRACTORS) - 1, 8), dtype=np.float32))
    elif how == "record":
        entry.with_suffix(".json").write_text("{not json")
    elif how == "no record":
        entry.with_suffix(".json").unlink()


@pytest.mark.parametrize("how", ["truncated", "flipped byte", "garbage", "pickled objects", "wrong shape", "record",
                                 "no record"])
def test_a_damaged_entry_is_ignored_and_rebuilt(data: Path, tmp_path: Path, how: str) -> None:
    cache = DescriptorCache(tmp_path / "cache")
    paths = load_revisitop(data / "roxford5k", distractors=data / "revisitop1m").database_paths[8:]
    model = TinyNet()
    expected = np.array(cache.descriptors(extract_descriptors, model, paths, TRANSFORM, OPTIONS))
    (entry,) = (tmp_path / "cache").glob("*.npy")
    marker = tmp_path / "code-ran"
    _damage(entry, how, marker)
    model.images.clear()
    out = cache.descriptors(extract_descriptors, model, paths, TRANSFORM, OPTIONS)
    assert sum(model.images) == len(paths)  # extracted again
    assert np.array_equal(out, expected) and not marker.exists()
    model.images.clear()  # the rebuilt entry is whole again: a hit
    assert np.array_equal(cache.descriptors(extract_descriptors, model, paths, TRANSFORM, OPTIONS), expected)
    assert model.images == []
    record = json.loads(entry.with_suffix(".json").read_text())
    assert record["shape"] == list(expected.shape) and record["description"]["images"] == len(paths)


def test_an_interrupted_extraction_leaves_no_entry(data: Path, tmp_path: Path) -> None:
    cache = DescriptorCache(tmp_path / "cache")
    paths = load_revisitop(data / "roxford5k", distractors=data / "revisitop1m").database_paths[8:]

    def failing(*args, **kwargs):
        extract_descriptors(*args, **kwargs)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.descriptors(failing, TinyNet(), paths, TRANSFORM, OPTIONS)
    assert list((tmp_path / "cache").iterdir()) == []


def test_the_config_key_builds_the_cache(tmp_path: Path) -> None:
    """evaluation.extraction.cache_dir -> ExtractionOptions.cache_dir -> the run's cache (none without it)."""
    from aggzoo.evaluation.options import EvaluationOptions, ExtractionOptions
    from aggzoo.run.evaluation_options import evaluation_options

    def composed(cache_dir: str | None) -> EvaluationOptions:
        return evaluation_options(OmegaConf.create({
            "recall_ks": [1], "eval_batch_size": 2, "num_workers": 0, "paths": {"output_dir": str(tmp_path)},
            "evaluation": {"extraction": {"cache_dir": cache_dir}}}))

    assert descriptor_cache(composed(None)) is None
    built = descriptor_cache(composed(str(tmp_path / "c")))
    assert isinstance(built, DescriptorCache) and built.folder == tmp_path / "c"
    with pytest.raises(ConfigError, match="evaluation.extraction.cache_dir must be a folder path"):
        EvaluationOptions(extraction=ExtractionOptions(cache_dir=" "))



def test_skipping_an_unreadable_distractor_keeps_the_count(data: Path, tmp_path: Path) -> None:
    """bad_images=skip drops an unreadable R1M image: the set's distractor count follows, so the cached
    rows are still exactly the distractors that remain."""
    from aggzoo.data.image_policy import ImagePolicy, drop_unreadable

    (data / "revisitop1m" / "jpg" / f"{DISTRACTORS[1]}.jpg").write_bytes(b"not a jpeg")
    oxford = load_revisitop(data / "roxford5k", distractors=data / "revisitop1m")
    reduced, counts = drop_unreadable(oxford, ImagePolicy("skip", log_path=tmp_path / "skipped.tsv"), num_workers=0)
    assert counts["skipped_database_images"] == 1
    assert reduced.distractors == len(DISTRACTORS) - 1 and reduced.num_database == 8 + len(DISTRACTORS) - 1
    result, images = _evaluate(TinyNet(), reduced, DescriptorCache(tmp_path / "cache"))
    (entry,) = (tmp_path / "cache").glob("*.npy")
    assert np.load(entry).shape[0] == len(DISTRACTORS) - 1
    assert np.array_equal(np.asarray(result.database_descriptors)[8:], np.load(entry))


@pytest.mark.slow
def test_eval_py_reuses_the_cache_across_runs(data: Path, tmp_path: Path) -> None:
    """``evaluation.extraction.cache_dir`` on the command line: the first ``eval.py`` run writes the R1M
    entry, the second reads it (the entry file is not replaced) and prints the same figures."""
    from robustness.entry_helpers import run_entry

    cache_dir = tmp_path / "descriptors"
    runs = []
    for run in ("first", "second"):
        out = tmp_path / run
        result = run_entry(["model=netvlad_efficientnet_lite0.synthetic", "benchmark=roxford5k_r1m",
                            f"paths.data_root={data}", "evaluation.outputs.pictures=false",
                            f"evaluation.extraction.cache_dir={cache_dir}", f"hydra.run.dir={out}"],
                           tmp_path, script="eval.py")
        assert result.returncode == 0, result.stderr[-3000:]
        (entry,) = cache_dir.glob("*.npy")
        runs.append((json.loads((out / "results.json").read_text())["results"][0]["metrics"], entry.stat()))
    (first, before), (second, after) = runs
    assert second == first and {"medium/mAP", "hard/mAP"} <= set(first)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    record = json.loads(next(cache_dir.glob("*.json")).read_text())
    assert record["shape"][0] == len(DISTRACTORS)
