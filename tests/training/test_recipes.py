"""Every conf/experiment recipe composes, matches the published values of REFERENCE.md (sections 2, 3
and 5, parsed from the file itself), builds the published network (descriptor size, cut, frozen
part), and trains one step on tiny stand-ins with its own optimiser, schedule and augmentation."""

from __future__ import annotations

import math
import re
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch
from hydra.utils import instantiate
from shared_paths import REFERENCE
from train_helpers import CONF, compose_train

from aggzoo.hub.builder import build_model
from aggzoo.run.model_by_name import model_spec
from aggzoo.run.pipeline import train

#: experiments that are local jobs rather than published recipes (the default-job smoke run, the real-data run)
LOCAL_JOBS = {"quick", "nordland_mini", "landmarks_arcface_quick"}
RECIPES = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml") if p.stem not in LOCAL_JOBS)

#: recipe -> its row label in REFERENCE.md section 3 (recipes without a row there: None)
TABLE_ROW = {"convap_resnet50": "ConvAP R50", "mixvpr_resnet50": "MixVPR R50", "salad_dinov2": "SALAD DINOv2",
             "boq_dinov2": "BoQ DINOv2", "image_dinov2": "ImAge", "boq_resnet50": None,
             "cosplace_resnet50": None, "netvlad_resnet50": None, "edtformer_dinov2": None,
             "supervlad_dinov2": None, "cricavpr_dinov2": None, "salad_cliquemining": None,
             "selavprpp_dinov2": None, "fol_dinov2": None,
             "delg_gem_resnet101_gldv2": None, "gsp_cub200": None}
#: recipe -> its row label in REFERENCE.md section 5 (descriptor size in parentheses)
RESULT_ROW = {"convap_resnet50": "ResNet50-ConvAP", "mixvpr_resnet50": "ResNet50-MixVPR",
              "salad_dinov2": "DINOv2-SALAD", "boq_dinov2": "DINOv2-BoQ", "boq_resnet50": "ResNet50-BoQ",
              "image_dinov2": "ImAge GSV", "supervlad_dinov2": "SuperVLAD†", "salad_cliquemining": "SALAD-CM"}
OPTIMIZERS = {"Adam": "torch.optim.Adam", "AdamW": "torch.optim.AdamW", "SGD": "torch.optim.SGD"}


def _reference_rows() -> dict[str, list[str]]:
    if not REFERENCE.is_file():
        pytest.skip(f"{REFERENCE} not found (it sits beside the team's checkout, or one level above AGGZOO_SHARED_DATA)")
    rows = {}
    for line in REFERENCE.read_text().splitlines():
        if line.startswith("| ") and not line.startswith("| model"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def test_every_recipe_is_checked() -> None:
    assert set(RECIPES) == set(TABLE_ROW), "a new recipe needs its REFERENCE.md row here"


@pytest.mark.parametrize("job", sorted(LOCAL_JOBS))
def test_local_jobs_compose(job: str, tmp_path: Path) -> None:
    cfg = compose_train([f"experiment={job}"], tmp_path)
    assert cfg.trainer.max_epochs >= 1 and cfg.data.places_per_batch >= 2


@pytest.mark.parametrize("recipe", [r for r, row in TABLE_ROW.items() if row])
def test_recipe_values_match_reference_table(recipe: str, tmp_path: Path) -> None:
    size, pxk, optimiser, schedule, epochs = _reference_rows()[TABLE_ROW[recipe]]
    cfg = compose_train([f"experiment={recipe}"], tmp_path)
    train_size, eval_size = (int(s) for s in size.split("/"))
    assert list(cfg.data.image_size) == [train_size, train_size]
    assert list(cfg.data.eval_image_size) == [eval_size, eval_size]
    p, k = (int(v) for v in pxk.split("x"))
    assert (cfg.data.places_per_batch, cfg.data.train.img_per_place) == (p, k)
    name, lr = re.match(r"(\w+) ([\d.e-]+)", optimiser).groups()
    assert cfg.optimizer._target_ == OPTIMIZERS[name] and cfg.optimizer.lr == pytest.approx(float(lr))
    if wd := re.search(r"wd ([\d.e-]+)", optimiser):
        assert cfg.optimizer.weight_decay == pytest.approx(float(wd.group(1)))
    assert cfg.trainer.max_epochs == int(epochs)
    sched = cfg.scheduler
    if m := re.match(r"warmup (\d+)(?: steps)?, x([\d.]+) at \[([\d,]+)\]", schedule):
        assert sched._target_.endswith("warmup_multistep") and sched.warmup_steps == int(m.group(1))
        assert sched.gamma == pytest.approx(float(m.group(2)))
        assert list(sched.milestones) == [int(v) for v in m.group(3).split(",")]
    elif m := re.match(r"linear ([\d.]+) -> ([\d.]+) over (\d+) steps", schedule):
        assert sched._target_.endswith("linear_decay") and sched.decay_steps == int(m.group(3))
        assert (sched.start_factor, sched.end_factor) == (float(m.group(1)), float(m.group(2)))
    elif m := re.match(r"(\d+)-epoch warmup, x([\d.]+) every (\d+)", schedule):
        assert sched._target_.endswith("warmup_multistep") and sched.warmup_epochs == int(m.group(1))
        every = int(m.group(3))
        assert list(sched.milestones) == list(range(every, int(epochs), every))
        assert sched.gamma == pytest.approx(float(m.group(2)))
    elif m := re.match(r"x([\d.]+) every (\d+) epochs", schedule):
        assert sched._target_.endswith("step_decay") and sched.step_epochs == int(m.group(2))
        assert sched.gamma == pytest.approx(float(m.group(1)))
    else:
        pytest.fail(f"unparsed schedule {schedule!r}")


def test_clique_mining_recipe_matches_its_reference_entry(tmp_path: Path) -> None:
    """conf/experiment/salad_cliquemining.yaml against REFERENCE.md's "SALAD-CM / CliqueMining" entry."""
    if not REFERENCE.is_file():
        pytest.skip(f"{REFERENCE} not found")
    text = REFERENCE.read_text()
    entry = " ".join(text[text.index("**SALAD-CM / CliqueMining**"):].split("\n\n", 1)[0].split())
    cfg = compose_train(["experiment=salad_cliquemining"], tmp_path)
    p, k, size = (int(v) for v in re.search(r"GSV-Cities batch \((\d+) places x (\d+), (\d+)", entry).groups())
    assert (cfg.data.places_per_batch, cfg.data.train.img_per_place, list(cfg.data.image_size)) == (p, k, [size, size])
    assert list(cfg.data.eval_image_size) == [int(re.search(r"\(random image, (\d+)\)", entry).group(1))] * 2
    mining = cfg.data.clique_mining
    assert mining.threshold == float(re.search(r"main\.py (\d+)\s*m", entry).group(1))
    pool, per_epoch = (int(v) for v in re.search(r"(\d+) batches prebuilt, (\d+)/epoch", entry).groups())
    assert (mining.num_batches, mining.batches_per_epoch, mining.similar_places) == (pool, per_epoch, 15)
    lr, wd, start, end, steps, precision, epochs = re.search(
        r"AdamW lr ([\d.e-]+),\s+wd ([\d.e-]+), LinearLR ([\d.]+) -> ([\d.]+) over (\d+) steps, (\S+), (\d+) epochs",
        entry).groups()
    assert cfg.optimizer._target_ == "torch.optim.AdamW" and cfg.optimizer.lr == pytest.approx(float(lr))
    assert cfg.optimizer.weight_decay == pytest.approx(float(wd))
    assert (cfg.scheduler.start_factor, cfg.scheduler.end_factor, cfg.scheduler.decay_steps) == (
        float(start), float(end), int(steps))
    assert cfg.trainer.precision == precision and cfg.trainer.max_epochs == int(epochs)
    assert cfg.head._target_.endswith("SALAD") and cfg.backbone.frozen_stages == 8  # last 4 of 12 blocks


def test_delg_recipe_matches_its_reference_entry(tmp_path: Path) -> None:
    """conf/experiment/delg_gem_resnet101_gldv2.yaml against REFERENCE.md's "DELG global training" facts (section 9)."""
    if not REFERENCE.is_file():
        pytest.skip(f"{REFERENCE} not found")
    text = " ".join(REFERENCE.read_text().split())
    entry = text[text.index("DELG global training"):][:400]
    p, whiten, margin, scale, lr = re.search(
        r"GeM p = ([\d.]+), (\d+)-D FC whitening, ArcFace margin ([\d.]+) \(radians\), scale initialised at "
        r"sqrt\(2048\) = ([\d.]+), SGD momentum 0.9, lr ([\d.]+) linear decay", entry).groups()
    cfg = compose_train(["experiment=delg_gem_resnet101_gldv2"], tmp_path)
    assert cfg.head._target_.endswith(".GeM") and cfg.head.p == float(p) and not cfg.head.learn_p
    assert cfg.head.whiten == int(whiten)
    assert cfg.loss.loss._target_.endswith("ArcFaceLoss")
    assert math.radians(cfg.loss.loss.margin) == pytest.approx(float(margin), abs=1e-6)  # the config is in degrees
    assert cfg.loss.loss.scale == pytest.approx(float(scale))
    assert cfg.optimizer._target_ == "torch.optim.SGD" and cfg.optimizer.lr == pytest.approx(float(lr))
    assert cfg.optimizer.momentum == pytest.approx(0.9)
    assert cfg.scheduler._target_.endswith("linear_decay") and cfg.scheduler.end_factor == 0.0
    assert cfg.scheduler.decay_steps is None  # to zero at the end of the run
    assert cfg.backbone.model_name == "resnet101"
    assert cfg.data.train._target_.endswith("ClassImagesDataset")
    assert cfg.data.train.images._target_ == "aggzoo.data.gldv2.read_gldv2_clean"


def _trainable_blocks(model) -> int:
    blocks = model.backbone.model.blocks
    return sum(any(p.requires_grad for p in block.parameters()) for block in blocks)


def _published_network(recipe: str, tmp_path: Path):
    cfg = compose_train([f"experiment={recipe}", "backbone.pretrained=false"], tmp_path)
    with torch.device("meta"):  # the full-size architecture, without allocating or initialising weights
        return cfg, build_model(model_spec(cfg))


@pytest.mark.parametrize("recipe", sorted(RESULT_ROW))
def test_recipe_descriptor_size_matches_reference(recipe: str, tmp_path: Path) -> None:
    rows = _reference_rows()  # skips without REFERENCE.md; the freeze checks below do not need it
    _, model = _published_network(recipe, tmp_path)
    row = next(label for label in rows if label.startswith(RESULT_ROW[recipe] + " ("))
    assert model.out_dim == int(re.search(r"\((\d+)\)", row).group(1))


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_builds_the_published_network(recipe: str, tmp_path: Path) -> None:
    cfg, model = _published_network(recipe, tmp_path)
    name = cfg.backbone.model_name
    if name in ("resnet101", "resnetv2_50"):  # DELG's global branch; GSP's ResNet50V2: the last block, all trained
        assert model.backbone.out_channels == 2048 and cfg.backbone.frozen_stages == 0
        assert all(p.requires_grad for p in model.backbone.parameters())
        assert model.out_dim == {"delg_gem_resnet101_gldv2": 2048, "gsp_cub200": 512}[recipe]
    elif name == "resnet50":  # REFERENCE section 2: layer3 (1024 ch) for MixVPR/BoQ/NetVLAD, layer4 for ConvAP/CosPlace
        expected = 2048 if recipe in ("convap_resnet50", "cosplace_resnet50") else 1024
        assert model.backbone.out_channels == expected
        frozen = {n.split(".")[1] for n, p in model.backbone.named_parameters() if not p.requires_grad}
        trainable = {n.split(".")[1] for n, p in model.backbone.named_parameters() if p.requires_grad}
        assert "layer1" in frozen and "layer3" in trainable and not frozen & trainable
        assert ("layer2" in trainable) == (recipe == "boq_resnet50")  # BoQ unfreezes 2 of the cropped stages
    else:  # DINOv2: SALAD trains the last 4 blocks + final norm, BoQ the last 2 without it, ImAge 8-11,
        # EDTformer none (its LoPA adapters beside the frozen ViT train instead)
        expected = {"salad_dinov2": 4, "salad_cliquemining": 4, "boq_dinov2": 2, "image_dinov2": 4, "edtformer_dinov2": 0,
                    "supervlad_dinov2": 4, "cricavpr_dinov2": 0, "selavprpp_dinov2": 0,
                    "fol_dinov2": 4}[recipe]
        assert _trainable_blocks(model) == expected
        assert cfg.backbone.get("final_norm", True) == (recipe != "boq_dinov2")
        if recipe == "edtformer_dinov2":
            trainable = {n.split(".")[0] for n, p in model.backbone.named_parameters() if p.requires_grad}
            assert trainable == {"adapters"} and model.out_dim == 4096
        if recipe == "cricavpr_dinov2":  # 10752 before the optional PCA (REFERENCE lists the 4096 after it)
            trainable = {n.split(".")[0] for n, p in model.backbone.named_parameters() if p.requires_grad}
            assert trainable == {"adapters"} and model.out_dim == 10752 and model.head.batch_dependent
        if recipe == "selavprpp_dinov2":  # ViT-L: 16 side-path adapters after blocks 8-23, 4096-D (REFERENCE section 8)
            trainable = {n.split(".")[0] for n, p in model.backbone.named_parameters() if p.requires_grad}
            assert trainable == {"adapters"} and len(model.backbone.adapters) == 16 and model.out_dim == 4096


#: tiny stand-ins per backbone family (the recipe keeps its head, optimiser, schedule and augmentation)
STAND_INS = {
    "resnet50": ["backbone.model_name=test_resnet", "backbone.pretrained=false"],
    "resnet101": ["backbone.model_name=test_resnet", "backbone.pretrained=false"],
    "resnetv2_50": ["backbone.model_name=test_resnet", "backbone.pretrained=false"],
    "vit_base_patch14_dinov2": ["backbone.model_name=test_vit", "backbone.pretrained=false",
                                "backbone.frozen_stages=4"],
    "vit_large_patch14_dinov2": ["backbone.model_name=test_vit", "backbone.pretrained=false",
                                 "backbone.start_block=0"],
    "vit_base_patch14_reg4_dinov2": ["backbone.model_name=test_vit", "backbone.pretrained=false",
                                     "backbone.insert_before_block=4"],
}
HEAD_FIT = {"mixvpr_resnet50": ["head.in_h=2", "head.in_w=3"], "salad_dinov2": ["++head.num_clusters=4"],
            # clique mining with the model being trained (the recipe's released SALAD is not here), a 2-batch pool
            "salad_cliquemining": ["++head.num_clusters=4", "data.clique_mining.descriptor_model=null",
                                   "data.clique_mining.num_batches=2"],
            "cricavpr_dinov2": ["++head.grids=[1,2]"],  # a 2 x 3 map at 32 x 48 holds no 3 x 3 grid
            "fol_dinov2": ["++head.num_clusters=4"],
            "gsp_cub200": ["head.num_prototypes=8"]}  # the tiny landmark set holds 29 images, fewer than 64


#: recipes that train every backbone weight (DELG's global branch, GSP's ResNet50V2)
WHOLE_BACKBONE = {"delg_gem_resnet101_gldv2", "gsp_cub200"}


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_trains_a_step_on_tiny_stand_ins(recipe: str, tiny_data, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGGZOO_DATA", str(tiny_data.root))
    recipe_cfg = compose_train([f"experiment={recipe}"], tmp_path)
    model_name = recipe_cfg.backbone.model_name
    # Place data: the tiny city's GSV-Cities split; class-labelled data: the tiny landmark set (2 images per class)
    data = ([f"data.train.root={tiny_data.gsv}"] if "root" in recipe_cfg.data.train else
            ["data=synthetic_landmarks", "synthetic_landmarks=tiny", "data.train.img_per_class=2"])
    overrides = [f"experiment={recipe}", *STAND_INS[model_name], *HEAD_FIT.get(recipe, []), "synthetic=tiny",
                 *data, "data.places_per_batch=4", "data.num_workers=0",
                 "data.image_size=[32,48]", "data.eval_image_size=[32,48]", "benchmark@val_benchmarks=[]",
                 "benchmark@test_benchmarks=[]", "evaluate_baseline=false", "trainer.precision=32-true",
                 "trainer.max_epochs=1", "trainer.limit_train_batches=1", "trainer.accelerator=cpu",
                 "callbacks.head_data_init.num_images=24", "callbacks.head_data_init.descriptors_per_image=8",
                 "logger=csv_only", "callbacks.progress_bar.refresh_rate=0", f"paths.log_dir={tmp_path}/logs"]
    cfg = compose_train(overrides, tmp_path / "run")
    L.seed_everything(cfg.seed, verbose=False)  # train() builds the same initial model from the seed
    before = {k: v.clone() for k, v in build_model(model_spec(cfg)).state_dict().items()}
    result = train(cfg)
    trainer = result["trainer"]
    assert trainer.global_step == 1
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    after = trainer.lightning_module.model.state_dict()
    changed = [k for k in before if before[k].is_floating_point() and not torch.equal(before[k], after[k])]
    assert any(k.startswith("backbone.") for k in changed)
    head_weights = [k for k in before if k.startswith("head.") and before[k].is_floating_point()]
    assert not head_weights or any(k in changed for k in head_weights)
    # The frozen stages did not move, batch-norm statistics included (they stay in eval mode).
    model = trainer.lightning_module.model
    frozen = {n.rsplit(".", 1)[0] for n, p in model.named_parameters() if not p.requires_grad}
    frozen_state = [k for k in before if k.rsplit(".", 1)[0] in frozen]
    if recipe in WHOLE_BACKBONE:
        assert not [k for k in frozen_state if k.startswith("backbone.")]
    else:
        assert frozen_state
    assert not [k for k in frozen_state if k in changed or k.endswith("num_batches_tracked")
                                 and not torch.equal(before[k], after[k])]
    assert type(trainer.optimizers[0]).__name__ == instantiate(cfg.optimizer).func.__name__
