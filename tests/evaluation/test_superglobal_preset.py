"""``eval.py model=cvnet_resnet50.official benchmark=roxford5k preset=superglobal`` end to end on a revisitop-layout
folder, with a random checkpoint in the authors' layout (``layouts/cvnet_r50.json``) given as ``ckpt_path``: the
recorded settings are SuperGlobal's, and a database descriptor equals the one computed here from the parts
(ReLU+ / GeM+ / regional GeM model, scale-GeM over 0.7071, 1, 1.4142 bilinear, max)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import aggzoo
from aggzoo.models.multiscale import MultiScale
from aggzoo.models.superglobal import superglobal_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "convert"))
from official_layouts import authors_layout, save


def _random_authors_file(path: Path) -> Path:
    """A CVNet_Rerank R50 state dict with small random weights and unit BN variances, wrapped as released."""
    generator = torch.Generator().manual_seed(0)
    state = {}
    for key, shape in authors_layout("cvnet_r50"):
        if key.endswith("num_batches_tracked"):
            state[key] = torch.tensor(1)
        elif key.endswith("running_var") or (key.endswith(".weight") and len(shape) == 1):
            state[key] = torch.ones(shape)
        elif key.endswith("head.pool.p"):
            state[key] = torch.full(shape, 3.0)
        else:
            state[key] = 0.05 * torch.randn(shape, generator=generator)
    return save({"model_state": state}, path)


@pytest.mark.slow
def test_eval_py_with_the_superglobal_preset(tmp_path: Path) -> None:
    from revisitop_files import DATABASE, write_revisitop
    from robustness.entry_helpers import run_entry

    root = write_revisitop(tmp_path / "data" / "roxford5k", scale=6)  # 384x288 database images
    weights = _random_authors_file(tmp_path / "CVPR2022_CVNet_R50.pyth")
    out = tmp_path / "run"
    result = run_entry(["model=cvnet_resnet50.official", f"ckpt_path={weights}", "benchmark=roxford5k",
                        "preset=superglobal", "evaluation.outputs.pictures=false",
                        "evaluation.outputs.save_descriptors=true", f"hydra.run.dir={out}"], tmp_path, script="eval.py")
    assert result.returncode == 0, result.stderr[-3000:]
    written = json.loads((out / "results.json").read_text())
    settings = written["meta"]["settings"]
    assert settings["pooling"] == "superglobal" and settings["relu_floor"] == 0.014
    assert (settings["scales"], settings["multiscale_reduce"], settings["multiscale_interpolation"]) == \
        ([0.7071, 1.0, 1.4142], "max", "bilinear")
    assert settings["rerank"] == {"top_m": 400, "k": 9, "beta": 0.15, "query_chunk": 16}
    assert {"easy/mAP", "medium/mAP", "hard/mAP"} <= set(written["results"][0]["metrics"])

    model = aggzoo.create_model("cvnet_resnet50.official", checkpoint_path=weights).eval()
    expected_model = MultiScale(superglobal_model(model), (0.7071, 1.0, 1.4142), reduce="max",
                                interpolation="bilinear").eval()
    image = np.asarray(Image.open(root / "jpg" / f"{DATABASE[0]}.jpg").convert("RGB"), dtype=np.float32) / 255
    mean, std = np.array(model.pretrained_cfg.mean), np.array(model.pretrained_cfg.std)
    x = torch.from_numpy(((image - mean) / std).astype(np.float32)).permute(2, 0, 1)[None]
    with torch.no_grad():
        expected = expected_model(x)[0].numpy()
    database = np.load(out / "descriptors_roxford5k.npz")["database"]
    np.testing.assert_allclose(database[0], expected, atol=1e-4)


@pytest.mark.slow
def test_the_preset_on_a_head_without_gem_is_one_error_line(tmp_path: Path) -> None:
    from revisitop_files import write_revisitop
    from robustness.entry_helpers import run_entry

    write_revisitop(tmp_path / "data" / "roxford5k")
    result = run_entry(["model=netvlad_efficientnet_lite0.synthetic", "benchmark=roxford5k", "preset=superglobal",
                        "evaluation.outputs.pictures=false", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path,
                       script="eval.py")
    assert result.returncode != 0
    assert "error: evaluation.test_time.pooling=superglobal replaces a GeM pooling; the NetVLAD head has none" \
        in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_test_time_choices_are_config_errors() -> None:
    from aggzoo.errors import ConfigError
    from aggzoo.evaluation.options import TestTimeOptions

    with pytest.raises(ConfigError, match="pooling='gem_plus' is not a pooling swap"):
        TestTimeOptions(pooling="gem_plus")
    with pytest.raises(ConfigError, match="multiscale_interpolation='area'"):
        TestTimeOptions(multiscale_interpolation="area")
