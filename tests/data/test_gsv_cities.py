"""GSV-Cities loader against files written here in the exact layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from aggzoo.data.gsv_cities import GSVCitiesDataset
from aggzoo.data.transforms import eval_transform
from aggzoo.errors import DatasetLayoutError

HEADER = "place_id,year,month,northdeg,city_id,lat,lon,panoid\n"


def _write_city(root: Path, city: str, images_per_place: list[int], colour_seed: int) -> None:
    (root / "Dataframes").mkdir(parents=True, exist_ok=True)
    (root / "Images" / city).mkdir(parents=True, exist_ok=True)
    rows = [HEADER]
    rng = np.random.default_rng(colour_seed)
    for place, count in enumerate(images_per_place):
        for j in range(count):
            lat, lon, pano = f"45.{place:04d}", "-73.5", f"pano{place}x{j}"
            rows.append(f"{place},{2015 + j},{(j % 12) + 1},{90 * j % 360},{city},{lat},{lon},{pano}\n")
            name = f"{city}_{place:07d}_{2015 + j:04d}_{(j % 12) + 1:02d}_{90 * j % 360:03d}_{lat}_{lon}_{pano}.jpg"
            Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(root / "Images" / city / name)
    (root / "Dataframes" / f"{city}.csv").write_text("".join(rows))


def test_places_images_and_unique_ids_across_cities(tmp_path: Path) -> None:
    _write_city(tmp_path, "Boston", [4, 5, 2, 4], 0)  # place 2 has too few images
    _write_city(tmp_path, "Osaka", [4, 4], 1)
    ds = GSVCitiesDataset(tmp_path, img_per_place=4, transform=eval_transform((16, 16)))
    assert len(ds) == 5
    assert sorted(ds.place_ids.tolist()) == [0, 1, 3, 100000, 100001]
    images, labels = ds[0]
    assert images.shape == (4, 3, 16, 16) and labels.tolist() == [ds.place_ids[0]] * 4
    only_osaka = GSVCitiesDataset(tmp_path, cities=["Osaka"], img_per_place=2)
    assert len(only_osaka) == 2 and only_osaka.place_ids.tolist() == [0, 1]


def test_k_down_to_two_and_draws_depend_only_on_seed_and_epoch(tmp_path: Path) -> None:
    _write_city(tmp_path, "Boston", [5, 5, 5], 0)
    a = GSVCitiesDataset(tmp_path, img_per_place=2, seed=3)
    b = GSVCitiesDataset(tmp_path, img_per_place=2, seed=3)
    draws = [a.image_paths(i) for i in range(3)]
    assert draws == [b.image_paths(i) for i in range(3)]
    assert all(len(set(d)) == 2 for d in draws)
    a.set_epoch(1)
    assert [a.image_paths(i) for i in range(3)] != draws


def test_newest_images_when_not_sampling(tmp_path: Path) -> None:
    _write_city(tmp_path, "Boston", [4], 0)
    ds = GSVCitiesDataset(tmp_path, img_per_place=2, random_sample_from_each_place=False)
    assert [p.name.split("_")[2] for p in ds.image_paths(0)] == ["2018", "2017"]


def test_missing_layout_and_missing_files_are_explained(tmp_path: Path) -> None:
    with pytest.raises(DatasetLayoutError, match="Dataframes/<City>.csv"):
        GSVCitiesDataset(tmp_path / "nowhere")
    _write_city(tmp_path, "Boston", [4, 4], 0)
    victim = next((tmp_path / "Images" / "Boston").glob("*.jpg"))
    victim.unlink()
    with pytest.raises(DatasetLayoutError, match=victim.name):
        GSVCitiesDataset(tmp_path, img_per_place=4)


def test_real_nordland_mini_layout(nordland_mini: Path) -> None:
    ds = GSVCitiesDataset(nordland_mini / "gsv", img_per_place=2)
    assert len(ds) == 2056 and ds.num_images == 4112
