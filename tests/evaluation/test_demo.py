"""The web demo: its search functions against independent expectations (brute-force scores, the VG
loader's ground truth, the evaluation's Recall@1), then the Gradio page through Gradio's own client
and in a real headless Chromium (each skipped with the reason when its extra is absent).

One small synthetic city (8 test places, 16 queries) and the shipped synthetic model, as the demo's
default is that model on the full-size city."""

from __future__ import annotations

import io
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from cdp import Chromium, chromium_binary
from PIL import Image

from aggzoo.cli import demo
from aggzoo.data.synthetic import SyntheticCityConfig, ensure_synthetic_city
from aggzoo.data.vg import load_vg
from aggzoo.errors import ConfigError, DatasetLayoutError, ImageReadError
from aggzoo.evaluation.loop import evaluate_retrieval
from aggzoo.evaluation.options import EvaluationOptions
from aggzoo.evaluation.place_search import (
    FRAME_COLOURS,
    PlaceSearch,
    framed_thumbnail,
    load_place_database,
    match_caption,
    matches_markdown,
    model_card,
)
from aggzoo.hub.factory import create_model, get_pretrained_cfg

try:
    import gradio  # noqa: F401
    HAS_GRADIO = True
except ImportError:
    HAS_GRADIO = False
needs_gradio = pytest.mark.skipif(not HAS_GRADIO, reason="gradio not installed (pip install 'aggzoo[demo]'); CI installs only .[test]")
needs_chromium = pytest.mark.skipif(chromium_binary() is None, reason="no chromium on PATH (Debian: apt-get install chromium)")


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test split (VG layout) of a small synthetic city of the default difficulty."""
    config = SyntheticCityConfig(train_places=1, images_per_train_place=1, val_places=1, test_places=8,
                                 image_size=(96, 72), difficulty=1.5)
    root = ensure_synthetic_city(tmp_path_factory.mktemp("city"), config, workers=1)
    return root / "vg" / "images" / "test"


@pytest.fixture(scope="module")
def search(split: Path) -> PlaceSearch:
    model = create_model(demo.DEFAULT_MODEL, pretrained=True)
    # Smaller than the model's 120 x 160 input, for the test's time; the search does not depend on it.
    return PlaceSearch(model, load_place_database(split), image_size=(64, 96))


def _utm(path: Path) -> np.ndarray:
    _, east, north, *_ = path.name.split("@")
    return np.array([float(east), float(north)])


def test_a_database_image_finds_itself_first_with_brute_force_scores(search: PlaceSearch) -> None:
    database = search.database
    target = 5
    matches = search.query(database.paths[target], k=len(database.paths))
    assert (matches[0].index, matches[0].path) == (target, database.paths[target])
    assert matches[0].score == pytest.approx(1.0, abs=1e-4)  # unit-norm descriptors, the same image
    assert matches[0].distance_m == pytest.approx(0.0) and matches[0].correct is True
    # Scores and order: exhaustive inner products with numpy, best first.
    query = search.describe(np.asarray(Image.open(database.paths[target]).convert("RGB")))[0]
    expected = search.descriptors @ query
    assert [m.index for m in matches] == list(np.argsort(-expected, kind="stable"))
    np.testing.assert_allclose([m.score for m in matches], np.sort(expected)[::-1], atol=1e-5)
    # Distances from the file names, parsed here independently.
    for m in matches:
        assert m.distance_m == pytest.approx(float(np.hypot(*(_utm(m.path) - _utm(database.paths[target])))))
        assert m.correct == (m.distance_m <= 25.0)


def test_correct_frames_are_the_vg_loaders_ground_truth_and_recall_matches_the_evaluation(search: PlaceSearch,
                                                                                          split: Path) -> None:
    benchmark = load_vg(split.parents[1], split="test")  # the evaluation's own loader of the same folder
    database = search.database
    assert database.paths == benchmark.database_paths and database.example_queries == benchmark.query_paths
    hits = []
    for q, path in enumerate(database.example_queries):
        matches = search.query(path, k=len(database.paths))
        assert sorted(m.index for m in matches if m.correct) == benchmark.positives[q].tolist()
        hits.append(matches[0].correct)
    result = evaluate_retrieval(search.model, benchmark, search.transform, EvaluationOptions(ks=(1,)))
    assert np.mean(hits) == pytest.approx(result.recalls[1])


def test_a_folder_without_utm_names_has_no_ground_truth(search: PlaceSearch, tmp_path: Path) -> None:
    for i, path in enumerate(search.database.paths[:4]):
        (tmp_path / "sub").mkdir(exist_ok=True)
        shutil.copy(path, tmp_path / "sub" / f"street_{i}.jpg")
    plain = load_place_database(tmp_path)
    assert plain.positions is None and plain.example_queries == () and len(plain.paths) == 4
    engine = PlaceSearch(search.model, plain, image_size=search.preprocessing["image_size"])
    matches = engine.query(search.database.paths[2], k=3)  # a UTM-named query, but the database has none
    assert matches[0].path.name == "street_2.jpg" and all(m.correct is None and m.distance_m is None for m in matches)
    assert "No ground truth" in matches_markdown(matches, plain, (0.0, 0.0))
    assert "unknown" in match_caption(matches[0]) and " m" not in match_caption(matches[0])


def test_database_layouts_and_errors(split: Path, tmp_path: Path) -> None:
    assert load_place_database(split.parents[1]).paths == load_place_database(split).paths  # <root>/images/test
    with pytest.raises(DatasetLayoutError, match="no such folder"):
        load_place_database(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetLayoutError, match="no images"):
        load_place_database(tmp_path / "empty")


def test_frames_are_drawn_in_the_verdict_colour(split: Path) -> None:
    path = next((split / "database").iterdir())
    for verdict, colour in FRAME_COLOURS.items():
        image = np.asarray(framed_thumbnail(path, verdict, height=40, border=3))
        assert image.shape[0] == 46 and tuple(image[1, 1]) == colour and tuple(image[-2, image.shape[1] // 2]) == colour


def test_model_card_shows_the_pretrained_cfg(search: PlaceSearch) -> None:
    cfg = get_pretrained_cfg(demo.DEFAULT_MODEL)
    card = model_card(search.model, demo.DEFAULT_MODEL)
    assert f"descriptor size D: {cfg.out_dim}" in card and f"licence: {cfg.license}" in card
    assert cfg.metrics and all(f"| {k.rpartition('/')[0]} | {k.rpartition('/')[2]} | {v:g} |" in card
                               for k, v in cfg.metrics.items())
    bare = model_card(create_model("gem_efficientnet_lite0", pretrained_backbone=False), "gem_efficientnet_lite0")
    assert "no recorded provenance" in bare


def test_options_parse_and_refuse_with_one_line() -> None:
    options = demo.parse_options(["model=x.y", "--database=/d", "k=7", "image_size=120,160", "port=7999"])
    assert (options.model, options.database, options.k, options.image_size, options.port) == ("x.y", "/d", 7, (120, 160), 7999)
    assert demo.parse_options([]).model == demo.DEFAULT_MODEL
    for bad, message in (["k=0"], "k=0: expected a whole number from 1 to 50"), (["colour=red"], "key=value options"):
        with pytest.raises(ConfigError, match=message):
            demo.parse_options(bad)


def test_the_command_without_gradio_says_which_extra(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "gradio", None)  # import gradio raises ImportError, as when absent
    with pytest.raises(SystemExit) as stop:
        demo.main(["model=netvlad_efficientnet_lite0.synthetic"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == "error: the demo needs Gradio: pip install 'aggzoo[demo]'"


# -- the page ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app(search: PlaceSearch):
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    page = demo.launch(demo.build_app(search, name=demo.DEFAULT_MODEL, k=4), host="127.0.0.1", block=False)
    yield page
    page.close()


def _png_rgb(path: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(Path(path).read_bytes())).convert("RGB"))


@needs_gradio
def test_search_through_gradios_client(app, search: PlaceSearch, tmp_path: Path) -> None:
    from gradio_client import Client, handle_file

    client = Client(app.local_url, verbose=False, download_files=str(tmp_path))
    query = search.database.example_queries[3]
    gallery, table = client.predict(handle_file(str(query)), 4, api_name="/search")
    direct = search.query(query, k=4)
    assert [item["caption"] for item in gallery] == [match_caption(m) for m in direct]
    assert table == matches_markdown(direct, search.database, tuple(_utm(query)))
    for item, match in zip(gallery, direct):
        image = _png_rgb(item["image"])  # the framed thumbnail, through the page's file route
        assert tuple(image[1, 1]) == FRAME_COLOURS[match.correct]


@needs_gradio
@needs_chromium
def test_a_browser_submits_a_query_and_sees_the_result_grid(app, search: PlaceSearch, tmp_path: Path) -> None:
    with Chromium(width=1280, height=1000) as browser:
        browser.goto(app.local_url)
        browser.wait_for("document.querySelector('#search') !== null")
        # Pick the first example query (Gradio's example table), then press Search.
        browser.wait_for("document.querySelector('#examples button.gallery-item') !== null")
        browser.evaluate("document.querySelector('#examples button.gallery-item').click()")
        browser.wait_for("document.querySelector('#query img') !== null")
        browser.evaluate("document.querySelector('#search').click()")
        count = browser.wait_for("(() => { const imgs = [...document.querySelectorAll('#results img')];"
                                 " return imgs.length >= 4 && imgs.every(i => i.complete && i.naturalWidth > 0)"
                                 " ? imgs.length : 0; })()")
        captions = browser.evaluate("[...document.querySelectorAll('#results .caption-label, #results figcaption')]"
                                    ".map(e => e.textContent.trim())")
        shot = browser.screenshot(tmp_path / "demo.png")
    expected = [match_caption(m) for m in search.query(search.database.example_queries[0], k=4)]
    assert count == 4 and [c for c in captions if c] == expected
    picture = np.asarray(Image.open(shot).convert("RGB"))
    assert picture.shape[1] == 1280
    # The grid is on the screenshot: pixels of the correct/wrong frame colours.
    colours = {FRAME_COLOURS[m.correct] for m in search.query(search.database.example_queries[0], k=4)}
    found = {c for c in colours if np.any(np.all(np.abs(picture.astype(int) - c) <= 3, axis=-1))}
    assert found == colours
    if target := os.environ.get("AGGZOO_DEMO_SCREENSHOT"):  # regenerate docs/demo.png: see the README
        shutil.copy(shot, target)


def test_an_unreadable_database_image_stops_the_demo_unless_skipped(split: Path, tmp_path: Path) -> None:
    """Issue 25, point 9: one corrupt file (a macOS ``._`` file) in the database folder; ``prepare`` is what
    ``aggzoo demo`` runs before it serves the page."""
    database = tmp_path / "db"
    database.mkdir()
    originals = sorted((split / "database").iterdir())[:6]
    for path in originals:
        (database / path.name).symlink_to(path)
    (database / "._photo.jpg").write_bytes(b"\x00\x05\x16\x07" + b"\x00" * 60)
    options = demo.parse_options(["model=gem_efficientnet_lite0", f"database={database}", "image_size=64,96"])
    with pytest.raises(ImageReadError, match=r"\._photo\.jpg.*start the demo without unreadable images with "
                                             r"bad_images=skip"):
        demo.prepare(options)
    skipping = demo.prepare(demo.parse_options([*(f"{k}={v}" for k, v in (("model", options.model),
                                                                           ("database", database),
                                                                           ("image_size", "64,96"))),
                                                "bad_images=skip"]))
    assert [p.name for p in skipping.database.paths] == [p.name for p in originals]
    # The ._ name carried no UTM and hid the others' positions; without it they are read from the names.
    np.testing.assert_array_equal(skipping.database.positions, np.stack([_utm(p) for p in originals]))
    assert skipping.descriptors.shape[0] == len(originals)
    with pytest.raises(ConfigError, match="bad_images=maybe: expected one of fail, skip"):
        demo.parse_options(["bad_images=maybe"])
