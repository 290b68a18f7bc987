"""fail / skip policy: training places draw other images deterministically, evaluation sets drop
unreadable images with re-indexed ground truth, and the skipped files are listed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from robust_helpers import NO_NORM, write_city
from torch.utils.data import DataLoader

from aggzoo.data.gsv_cities import GSVCitiesDataset
from aggzoo.data.image_policy import ImagePolicy, check_readable, drop_unreadable, scan_images
from aggzoo.data.images import ImageReadError
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.data.transforms import eval_transform


def _colour_ids(images: torch.Tensor) -> list[tuple[int, int]]:
    """Undo the flat-colour encoding of :func:`write_city` after ``eval_transform`` (no normalisation)."""
    rgb = images[:, :2, 0, 0] * 255
    return [(round(float(r) / 10), round(float(g) / 10)) for r, g in rgb]


def test_policy_fail_raises_with_hint_and_skip_lists(tmp_path: Path) -> None:
    (tmp_path / "bad.jpg").write_text("not an image")
    with pytest.raises(ImageReadError, match=r"bad\.jpg: not an image .*\. use bad_images=skip"):
        ImagePolicy("fail", hint="use bad_images=skip").read(tmp_path / "bad.jpg")
    policy = ImagePolicy("skip", log_path=tmp_path / "out" / "bad_images.tsv")
    assert policy.read(tmp_path / "bad.jpg") is None
    assert policy.read(tmp_path / "bad.jpg") is None
    assert (tmp_path / "out" / "bad_images.tsv").read_text().count("bad.jpg") == 2  # one line per event
    assert list(policy.finalize()) == [str(tmp_path / "bad.jpg")]
    assert (tmp_path / "out" / "bad_images.tsv").read_text().count("bad.jpg") == 1  # de-duplicated
    with pytest.raises(ValueError, match=r"bad_images must be one of \('fail', 'skip'\), got 'skp'"):
        ImagePolicy("skp")


def test_bad_training_image_is_replaced_by_another_image_of_its_place(tmp_path: Path) -> None:
    paths = write_city(tmp_path, [6, 6, 6])
    kwargs = dict(img_per_place=4, transform=eval_transform((6, 8), **NO_NORM), seed=5)
    clean = GSVCitiesDataset(tmp_path, **kwargs)
    drawn = clean.image_paths(1)
    victim = drawn[2]
    victim.write_bytes(victim.read_bytes()[:40])  # truncate one of place 1's drawn images
    ds = GSVCitiesDataset(tmp_path, bad_images=ImagePolicy("skip", log_path=tmp_path / "skipped.tsv"), **kwargs)
    images, labels = ds[1]
    ids = _colour_ids(images)
    assert labels.tolist() == [1] * 4 and all(p == 1 for p, _ in ids) and len(set(ids)) == 4
    j_victim = paths[1].index(victim)
    assert (1, j_victim) not in ids
    # The three readable drawn images are kept in order; the replacement is the first other image
    # of the place in the seeded order.
    kept = [(1, paths[1].index(p)) for p in drawn if p != victim]
    assert ids[:3] == kept
    replacement = next(p for p in ds.candidate_paths(1)[4:] if p != victim)
    assert ids[3] == (1, paths[1].index(replacement))
    assert str(victim) in ds.bad_images.skipped()
    # Same seed, same epoch, same bad files -> same item.
    again = GSVCitiesDataset(tmp_path, bad_images="skip", **kwargs)
    assert torch.equal(again[1][0], images)


def test_place_without_enough_readable_images_is_replaced_by_the_next(tmp_path: Path) -> None:
    paths = write_city(tmp_path, [4, 4, 4])
    for path in paths[1][:2]:
        path.write_bytes(b"")
    ds = GSVCitiesDataset(tmp_path, img_per_place=4, transform=eval_transform((6, 8), **NO_NORM))
    images, labels = ds[1]
    assert labels.tolist() == [2] * 4 and {p for p, _ in _colour_ids(images)} == {2}
    assert "fewer than 4 readable images; replaced by place 2" in ds.bad_images.skipped()["place:1"]
    with pytest.raises(ImageReadError, match=r"cannot read image .*: empty file \(0 bytes\)"):
        GSVCitiesDataset(tmp_path, img_per_place=4, bad_images="fail",
                         transform=eval_transform((6, 8), **NO_NORM))[1]


def test_skipping_is_identical_with_and_without_loader_workers(tmp_path: Path) -> None:
    paths = write_city(tmp_path, [5] * 8)
    for place in (0, 3, 6):
        paths[place][1].write_text("oops")
    log = tmp_path / "run" / "bad_images.tsv"

    def epoch(workers: int) -> list[torch.Tensor]:
        ds = GSVCitiesDataset(tmp_path, img_per_place=3, transform=eval_transform((6, 8), **NO_NORM), seed=1,
                              bad_images=ImagePolicy("skip", log_path=log))
        ds.set_epoch(2)
        loader = DataLoader(ds, batch_size=3, shuffle=False, num_workers=workers)
        return [torch.cat([b[0].flatten(), b[1].flatten().float()]) for b in loader]

    single, multi = epoch(0), epoch(2)
    assert all(torch.equal(a, b) for a, b in zip(single, multi, strict=True))
    listed = ImagePolicy("skip", log_path=log).finalize()
    drawn_bad = {str(paths[p][1]) for p in (0, 3, 6)}
    assert set(listed) <= drawn_bad and listed  # workers' records reach the one list


def _retrieval_set(tmp_path: Path) -> RetrievalSet:
    db = []
    for i in range(5):
        db.append(tmp_path / f"db{i}.png")
        Image.new("RGB", (4, 4), (i, 0, 0)).save(db[-1])
    queries = []
    for i in range(3):
        queries.append(tmp_path / f"q{i}.png")
        Image.new("RGB", (4, 4), (0, i, 0)).save(queries[-1])
    positives = (np.array([0, 1, 4]), np.array([1]), np.array([2, 3]))
    return RetrievalSet("toy", tuple(db), tuple(queries), positives)


def test_drop_unreadable_reindexes_positives(tmp_path: Path) -> None:
    rs = _retrieval_set(tmp_path)
    rs.database_paths[1].write_bytes(b"")
    rs.query_paths[2].write_text("text")
    policy = ImagePolicy("skip", log_path=tmp_path / "bad_images.tsv")
    reduced, counts = drop_unreadable(rs, policy)
    assert counts == {"skipped_database_images": 1, "skipped_queries": 1}
    assert [p.name for p in reduced.database_paths] == ["db0.png", "db2.png", "db3.png", "db4.png"]
    assert [p.name for p in reduced.query_paths] == ["q0.png", "q1.png"]
    # q0's positives {0, 1, 4} -> {0, 3} (db1 gone, db4 is now index 3); q1's only positive was db1.
    assert [p.tolist() for p in reduced.positives] == [[0, 3], []]
    assert reduced.queries_without_positive == 1
    assert set(policy.finalize()) == {str(rs.database_paths[1]), str(rs.query_paths[2])}


def test_check_readable_lists_every_bad_file_at_once(tmp_path: Path) -> None:
    rs = _retrieval_set(tmp_path)
    check_readable(rs)  # all fine
    rs.database_paths[0].write_bytes(b"")
    rs.query_paths[1].write_text("text")
    rs.database_paths[3].unlink()
    with pytest.raises(ImageReadError) as info:
        check_readable(rs)
    message = str(info.value)
    assert message.startswith("3 of 8 images of benchmark 'toy' cannot be read")
    for name in ("db0.png: empty file", "q1.png: not an image", "db3.png: file not found"):
        assert name in message
    assert "bad_images=skip" in message
    # A truncated file passes the header check and is found by the full one.
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(
        rs.database_paths[2])
    good = rs.database_paths[2].read_bytes()
    rs.database_paths[2].write_bytes(good[: len(good) // 2])
    assert 2 not in scan_images(rs.database_paths, full=False)
    assert "truncated" in scan_images(rs.database_paths, full=True)[2]


def _data_init_fit(tmp_path: Path, on_error: str, head: str) -> tuple[ImagePolicy, Path]:
    """A 0-byte training image, then a ``max_steps=0`` fit with the data-driven head initialisation
    sampling every training image (issue 14 item 4: that loader ignored the policy)."""
    import functools

    import lightning.pytorch as L
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from aggzoo.models.backbones.timm_backbone import TimmBackbone
    from aggzoo.models.heads.gsp import GSP
    from aggzoo.models.heads.netvlad import NetVLAD
    from aggzoo.models.vpr_model import VPRModel
    from aggzoo.training.callbacks import HeadDataInit
    from aggzoo.training.datamodule import VPRDataModule
    from aggzoo.training.module import VPRLightningModule

    paths = write_city(tmp_path / "gsv", [4, 4, 4])
    victim = paths[1][2]
    victim.write_bytes(b"")
    policy = ImagePolicy(on_error, log_path=tmp_path / "run" / "bad_images.tsv",
                         hint="Fix or remove the file, or skip unreadable training images with bad_images=skip")
    transform = eval_transform((32, 32))
    dataset = GSVCitiesDataset(tmp_path / "gsv", img_per_place=2, transform=transform, bad_images=policy)
    head_cls = (functools.partial(NetVLAD, num_clusters=4) if head == "netvlad"
                else functools.partial(GSP, embedding_dim=8, num_prototypes=4))
    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("test_resnet", out_indices=(3,)), head_cls)
    conf = Path(__file__).resolve().parents[2] / "conf"
    module = VPRLightningModule(model, loss=instantiate(OmegaConf.load(conf / "loss" / "multisimilarity.yaml")),
                                optimizer=functools.partial(torch.optim.AdamW, lr=1e-3))
    data = VPRDataModule(train_dataset=dataset, val_sets={}, eval_transform=transform, places_per_batch=2,
                         eval_batch_size=4)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[HeadDataInit(num_images=12, descriptors_per_image=4, pooled_images=12, niter=5)])
    trainer.fit(module, datamodule=data)
    return policy, victim


@pytest.mark.parametrize("head", ["netvlad", "gsp"])
def test_head_data_init_skips_an_empty_training_image_under_skip(tmp_path: Path, head: str) -> None:
    policy, victim = _data_init_fit(tmp_path, "skip", head)
    skipped = policy.finalize()
    assert list(skipped) == [str(victim)] and "empty" in skipped[str(victim)]
    assert str(victim) in (tmp_path / "run" / "bad_images.tsv").read_text()


@pytest.mark.parametrize("head", ["netvlad", "gsp"])
def test_head_data_init_fails_naming_the_file_under_fail(tmp_path: Path, head: str) -> None:
    with pytest.raises(ImageReadError, match=r"Lund_0000001.*\.jpg.*bad_images=skip"):
        _data_init_fit(tmp_path, "fail", head)
