"""Train a VPR model: ``python train.py [backbone=...] [head=...] [data=...] [key=value ...]``."""

import hydra
from omegaconf import DictConfig

import aggzoo  # noqa: F401  (sets NO_ALBUMENTATIONS_UPDATE before anything imports albumentations)


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from aggzoo.pipeline import train

    train(cfg)


if __name__ == "__main__":
    main()
