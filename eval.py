"""Evaluate a checkpoint: ``python eval.py ckpt_path=PATH benchmark=NAME`` (or ``benchmark=[a,b]``)."""

import hydra
from omegaconf import DictConfig

import aggzoo  # noqa: F401  (sets NO_ALBUMENTATIONS_UPDATE before anything imports albumentations)


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    from aggzoo.pipeline import evaluate

    evaluate(cfg)


if __name__ == "__main__":
    main()
