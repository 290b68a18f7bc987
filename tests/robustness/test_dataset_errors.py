"""Missing folders, empty splits, malformed names and CSV rows: one message with the expected layout."""

from __future__ import annotations

from pathlib import Path

import pytest
from robust_helpers import write_city, write_vg

from aggzoo.data.gsv_cities import GSVCitiesDataset
from aggzoo.data.vg import load_vg
from aggzoo.errors import DatasetFormatError, DatasetLayoutError


def test_vg_missing_root_split_and_empty_folders(tmp_path: Path) -> None:
    with pytest.raises(DatasetLayoutError, match=r"^dataset root not found: .*nowhere\. .* is empty\. Expected layout: <root>/images/"
                                                 r"<split>/database/@UTM_east@UTM_north@.*Data: https://github\.com/"
                                                 r"gmberton/VPR-datasets-downloader"):
        load_vg(tmp_path / "nowhere")
    write_vg(tmp_path / "ds", "val", num_places=2)
    with pytest.raises(DatasetLayoutError, match=r"^split 'test' folder not found: .*ds/images/test\. Found in "
                                                 r".*ds/images: \['val'\]\."):
        load_vg(tmp_path / "ds", split="test")
    for image in (tmp_path / "ds" / "images" / "val" / "database").iterdir():
        image.unlink()
    with pytest.raises(DatasetLayoutError, match=r"^no images \(\.jpg, \.jpeg, \.png, .*\) under .*val/database\. "
                                                 r"Expected the VG layout"):
        load_vg(tmp_path / "ds", split="val")


def test_vg_malformed_name_names_the_file(tmp_path: Path) -> None:
    write_vg(tmp_path, "test", num_places=2)
    odd = tmp_path / "images" / "test" / "queries" / "IMG_0042.jpg"
    odd.write_bytes((tmp_path / "images" / "test" / "database").iterdir().__next__().read_bytes())
    with pytest.raises(DatasetFormatError, match=rf"^{odd}: VG image names must start with '@<UTM_east>@<UTM_north>@'"):
        load_vg(tmp_path, split="test")


def test_gsv_missing_folders_columns_rows_and_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetLayoutError, match=r"^GSV-Cities folder .*nowhere lacks Dataframes/ or Images/\n"
                                                 r"expected GSV-Cities layout:"):
        GSVCitiesDataset(tmp_path / "nowhere")
    paths = write_city(tmp_path / "a", [2, 2])
    csv = tmp_path / "a" / "Dataframes" / "Lund.csv"
    csv.write_text(csv.read_text().replace("panoid", "pano_id"))
    with pytest.raises(DatasetLayoutError, match=r"Lund\.csv: missing columns \['panoid'\]"):
        GSVCitiesDataset(tmp_path / "a", img_per_place=2)
    csv.write_text(csv.read_text().replace("pano_id", "panoid").replace("\n0,2011", "\nzero,2011"))
    with pytest.raises(DatasetFormatError, match=r"Lund\.csv, line 3: malformed row .*invalid literal for int"):
        GSVCitiesDataset(tmp_path / "a", img_per_place=2)
    csv.write_text(csv.read_text().replace("\nzero,2011", "\n0,2011"))
    paths[1][0].unlink()
    with pytest.raises(DatasetLayoutError, match=rf"^1 images listed in .*Dataframes do not exist, e\.g\.:\n  {paths[1][0]}"):
        GSVCitiesDataset(tmp_path / "a", img_per_place=2)
    write_city(tmp_path / "b", [2, 2])
    with pytest.raises(DatasetLayoutError, match=r"^no place in .*b has at least 3 images; lower img_per_place"):
        GSVCitiesDataset(tmp_path / "b", img_per_place=3)
