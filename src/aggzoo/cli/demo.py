"""``python -m aggzoo.cli.demo [model=<name>] [database=<folder>] [k=5] [port=7860]``: a web demo.

Pick one of the example queries (a VG split's ``queries/``) or upload an image, and see the top-k
database images with their scores, framed green / red when the names carry UTM coordinates (correct
within 25 m, or not) with the distance in metres, and the model's card (paper, licence, D, recorded
results). Defaults: the shipped ``netvlad_efficientnet_lite0.synthetic`` on the test split of the
synthetic city it was measured on (generated offline on first use, then cached), so it runs offline.

Options (``key=value``, as the Hydra entry points take them): ``model`` (a registered name with its
tag, a checkpoint file or a saved folder; see ``python -m aggzoo.cli.models``), ``database`` (a folder
of images, or a VG split / dataset root), ``k`` (results shown first, 1..50), ``host`` (default
127.0.0.1), ``port`` (default: the first free one from 7860), ``image_size`` (``H,W``; default the
model's input size), ``examples`` (example queries offered, default 24), ``device`` (cpu, cuda),
``bad_images`` (``fail``, default: an unreadable database image stops the demo, naming it; ``skip``:
the demo starts without the unreadable ones and names them).

The search itself is :mod:`aggzoo.evaluation.place_search` (plain functions, tested without a web
framework); this module is only the Gradio page around it (``pip install 'aggzoo[demo]'``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from aggzoo.cli.reporting import reported_user_errors
from aggzoo.data.image_policy import BAD_IMAGE_CHOICES, ImagePolicy
from aggzoo.data.synthetic import SyntheticCityConfig, synthetic_city_path
from aggzoo.errors import ConfigError, ImageReadError, MissingExtraError
from aggzoo.evaluation.place_search import (
    PlaceSearch,
    framed_thumbnail,
    load_place_database,
    match_caption,
    matches_markdown,
    model_card,
    position_from_name,
)
from aggzoo.evaluation.unlabelled import readable_images
from aggzoo.hub.cfg import split_name
from aggzoo.hub.factory import create_model
from aggzoo.hub.manifest import read_manifest

__all__ = ["DEFAULT_MODEL", "DemoOptions", "build_app", "default_database", "launch", "main", "parse_options",
           "prepare"]

DEFAULT_MODEL = "netvlad_efficientnet_lite0.synthetic"


@dataclass(frozen=True)
class DemoOptions:
    """What the command line sets (see the module docstring)."""

    model: str = DEFAULT_MODEL
    database: str | None = None
    k: int = 5
    host: str = "127.0.0.1"
    port: int | None = None
    image_size: tuple[int, int] | None = None
    examples: int = 24
    device: str = "cpu"
    bad_images: str = "fail"


def _int(key: str, value: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if not low <= number <= high:
        raise ConfigError(f"{key}={value}: expected a whole number from {low} to {high}")
    return number


def parse_options(argv: Sequence[str]) -> DemoOptions:
    """``["model=...", "database=...", "k=5"]`` (``--key=value`` too) -> :class:`DemoOptions`."""
    known = set(DemoOptions.__dataclass_fields__)
    values: dict[str, Any] = {}
    for arg in argv:
        key, eq, value = arg.lstrip("-").partition("=")
        if not eq or key not in known:
            raise ConfigError(f"{arg!r}: the demo takes key=value options, one of {sorted(known)} "
                              "(e.g. model=netvlad_efficientnet_lite0.synthetic database=/path/to/images)")
        if key == "k":
            values[key] = _int(key, value, 1, 50)
        elif key == "examples":
            values[key] = _int(key, value, 0, 200)
        elif key == "port":
            values[key] = _int(key, value, 1, 65535)
        elif key == "bad_images" and value not in BAD_IMAGE_CHOICES:
            raise ConfigError(f"bad_images={value}: expected one of {', '.join(BAD_IMAGE_CHOICES)}")
        elif key == "image_size":
            sides = value.strip("[]()").replace("x", ",").split(",")
            if len(sides) != 2:
                raise ConfigError(f"image_size={value}: expected H,W (e.g. image_size=120,160)")
            values[key] = (_int(key, sides[0], 32, 4096), _int(key, sides[1], 32, 4096))
        else:
            values[key] = value
    return DemoOptions(**values)


def default_database() -> Path:
    """The test split of the synthetic city that :data:`DEFAULT_MODEL`'s recorded results were
    measured on (its manifest entry's ``evaluation.synthetic``), generated on first use."""
    entry = next(e for e in read_manifest() if e.name == DEFAULT_MODEL)
    config = SyntheticCityConfig(**dict(entry.evaluation.get("synthetic") or {}))
    return synthetic_city_path("vg", config) / "images" / entry.evaluation.get("split", "test")


def prepare(options: DemoOptions) -> PlaceSearch:
    """Load the model (a tagged name with its weights) and index the database."""
    architecture, tag = split_name(options.model)
    model = create_model(options.model, pretrained=tag is not None)
    model.aggzoo_name = options.model
    database = load_place_database(options.database if options.database is not None else default_database())
    if options.bad_images == "skip":  # every image decoded once first; the unreadable ones leave the database
        policy = ImagePolicy("skip")
        kept = readable_images(database.paths, policy)
        if not kept:
            raise ImageReadError(f"none of the {len(database.paths)} database images under {database.root} can be read")
        if skipped := policy.skipped():
            # positions again from the names kept: a skipped ._photo.jpg carries none, and no longer hides the others'
            found = [position_from_name(path) for path in kept]
            database = replace(database, paths=kept, positions=np.array(found, dtype=np.float64)
                               if all(f is not None for f in found) else None)
            listed = "; ".join(f"{path}: {reason}" for path, reason in list(skipped.items())[:5])
            print(f"note: the demo searches without {len(skipped)} unreadable database images (bad_images=skip): {listed}")
    try:
        return PlaceSearch(model, database, image_size=options.image_size, device=options.device)
    except ImageReadError as err:
        raise ImageReadError(f"{err}. Fix or remove the file, or start the demo without unreadable images with "
                             "bad_images=skip") from err


def _gradio() -> Any:
    try:
        import gradio
    except ImportError:
        raise MissingExtraError("the demo needs Gradio: pip install 'aggzoo[demo]'") from None
    return gradio


def build_app(search: PlaceSearch, *, name: str, k: int = 5, examples: int = 24) -> Any:
    """The Gradio page: query (upload or example) and top-k slider -> result gallery + table; model card."""
    gr = _gradio()
    database = search.database

    def run(query: str | None, top_k: float) -> tuple[list[tuple[Any, str]], str]:
        if not query:
            raise gr.Error("Pick an example query or upload an image first.")
        position = position_from_name(query)
        matches = search.query(query, int(top_k), position=position)
        gallery = [(framed_thumbnail(m.path, m.correct), match_caption(m)) for m in matches]
        return gallery, matches_markdown(matches, database, position)

    with gr.Blocks(title=f"aggzoo demo: {name}", analytics_enabled=False) as app:
        gr.Markdown(f"## aggzoo place recognition demo\n`{name}` on `{database.root}` "
                    f"({len(database.paths)} database images). Results are framed green when within "
                    f"{database.radius_m:g} m of the query, red when not (needs UTM names `@east@north@...`).")
        with gr.Row():
            with gr.Column(scale=1):
                query = gr.Image(type="filepath", label="Query", sources=["upload", "clipboard"], elem_id="query",
                                 height=240)
                top_k = gr.Slider(1, min(50, len(database.paths)), value=min(k, len(database.paths)), step=1,
                                  label="top-k", elem_id="top_k")
                button = gr.Button("Search", variant="primary", elem_id="search")
                if database.example_queries and examples:
                    gr.Examples([[str(p)] for p in database.example_queries[:examples]], inputs=[query],
                                label=f"Example queries ({database.root.name}/queries)", examples_per_page=12,
                                elem_id="examples")
            with gr.Column(scale=3):
                gallery = gr.Gallery(label="Top-k database images", columns=5, object_fit="contain", height="auto",
                                     format="png", elem_id="results")
                table = gr.Markdown(elem_id="result_table")
        with gr.Accordion("Model card", open=True):
            gr.Markdown(model_card(search.model, name), elem_id="model_card")
        button.click(run, inputs=[query, top_k], outputs=[gallery, table], api_name="search")
    app.aggzoo_allowed_paths = [str(database.root)]
    return app


def launch(app: Any, *, host: str = "127.0.0.1", port: int | None = None, block: bool = True) -> Any:
    """Serve ``app``; ``block=False`` returns at once (``app.local_url``, ``app.close()``), for tests."""
    app.launch(server_name=host, server_port=port, prevent_thread_lock=not block, quiet=not block,
               allowed_paths=getattr(app, "aggzoo_allowed_paths", None), ssr_mode=False)
    return app


def main(argv: Sequence[str] | None = None, *, prog: str = "aggzoo demo") -> int:
    """The demo command (``aggzoo demo ...`` calls this with its arguments; ``prog`` as the other commands)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help", "help") for a in args):
        print(f"usage: {prog} [key=value ...]\n\n{__doc__}")
        raise SystemExit(0)  # as argparse's --help of the other commands
    with reported_user_errors():
        options = parse_options(args)
        _gradio()  # before minutes of indexing, say that the extra is missing
        search = prepare(options)
        app = build_app(search, name=options.model, k=options.k, examples=options.examples)
        print(f"aggzoo demo: {options.model} on {search.database.root} ({len(search.database.paths)} images)")
        launch(app, host=options.host, port=options.port, block=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
