"""Training objectives injected from config: a pytorch-metric-learning pair loss and its miner
(:class:`MetricLoss`), a margin classification loss with its own class weights (:class:`MarginLoss`),
SelaVPR++'s hashing objective (:class:`HashingLoss`) and FoL's objective (:class:`FoLLoss`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from pytorch_metric_learning.miners import BatchHardMiner
from torch import Tensor, nn

from aggzoo.models.heads.fol import FoLOutputs

__all__ = ["FoLLoss", "HashingLoss", "MarginLoss", "MetricLoss", "loss_parameter_groups"]


class MetricLoss(nn.Module):
    """``loss(descriptors [N, D], labels [N]) -> scalar``, mining pairs first when a miner is set.

    Args:
        loss: a ``pytorch_metric_learning.losses`` object (e.g. ``MultiSimilarityLoss(alpha=1,
            beta=50, base=0)``, the GSV-Cities recipe).
        miner: a ``pytorch_metric_learning.miners`` object (``MultiSimilarityMiner(epsilon=0.1)``)
            or ``None``.

    ``last_mined_fraction`` records the fraction of the batch's images that appear in a mined
    pair, which the training module logs (upstream's "b_acc" signal of how hard the batch was).
    """

    def __init__(self, loss: nn.Module, miner: nn.Module | None = None) -> None:
        super().__init__()
        self.loss = loss
        self.miner = miner
        self.last_mined_fraction = 1.0

    def forward(self, descriptors: Tensor, labels: Tensor) -> Tensor:
        # Similarities, mining margins and exp(beta * s) in fp32: casting the input is not enough under
        # autocast, which would run the loss's matmul in bf16/fp16 again (s to ~3 digits, beta = 50).
        with torch.autocast(device_type=descriptors.device.type, enabled=False):
            descriptors = descriptors.float()
            if self.miner is None:
                return self.loss(descriptors, labels)
            pairs = self.miner(descriptors, labels)
            used = (torch.unique(torch.cat([t for t in pairs if t.numel()])) if any(t.numel() for t in pairs)
                    else labels[:0])
            self.last_mined_fraction = used.numel() / max(1, labels.numel())
            return self.loss(descriptors, labels, pairs)


class HashingLoss(nn.Module):
    """SelaVPR++'s objective for its hashing branch (Lu-Feng/SelaVPRplusplus ``train_rerank.py``, MIT;
    re-implemented): ``loss(z [N, bits], b [N, bits], labels [N]) -> scalar``,

        L = MS(b) + weight * mean_{(i, j) mined} (z_i . z_j - b_i . b_j / bits)^2

    with ``z`` the unit-norm hashing embedding, ``b = sign(z)`` its codes (straight-through, so both terms train
    ``z``), the pairs mined on ``b`` by ``miner`` (MultiSimilarityMiner, cosine: positive and negative pairs
    together) and ``MS`` the metric loss on ``b`` with those pairs (MultiSimilarityLoss; its distance normalises
    ``b`` to ``b / sqrt(bits)``). ``weight`` is upstream's 0.1. Without mined pairs the second term is 0 (upstream
    would average an empty tensor).
    """

    def __init__(self, loss: nn.Module, miner: nn.Module, *, weight: float = 0.1) -> None:
        super().__init__()
        self.loss = loss
        self.miner = miner
        self.weight = weight

    def forward(self, z: Tensor, b: Tensor, labels: Tensor) -> Tensor:
        with torch.autocast(device_type=z.device.type, enabled=False):
            z, b = z.float(), b.float()
            anchors_pos, positives, anchors_neg, negatives = self.miner(b, labels)
            metric = self.loss(b, labels, (anchors_pos, positives, anchors_neg, negatives))
            left, right = torch.cat([anchors_pos, anchors_neg]), torch.cat([positives, negatives])
            if left.numel() == 0:
                return metric + 0.0 * z.sum()
            gap = (z[left] * z[right]).sum(-1) - (b[left] * b[right]).sum(-1) / b.shape[1]
            return metric + self.weight * gap.pow(2).mean()


def _place_groups(labels: Tensor) -> list[list[int]]:
    """For each image, the batch indices of its place's images, in batch order."""
    groups: dict[int, list[int]] = {}
    for index, label in enumerate(labels.tolist()):
        groups.setdefault(int(label), []).append(index)
    return [groups[int(label)] for label in labels.tolist()]


class FoLLoss(nn.Module):
    """FoL's training objective (chenshunpeng/FoL ``loss.py``, ``train.py``, Apache-2.0; re-implemented from
    them): ``loss(outputs: FoLOutputs, labels [N]) -> scalar`` (:meth:`aggzoo.models.heads.fol.FoL.outputs`),

        L = MS(descriptors) + L_local + kl_weight * (KL(I || C) + KL(C || I)) + L_sep + L_ws

    - ``MS``: ``metric`` (MultiSimilarityLoss + MultiSimilarityMiner, the GSV-Cities recipe);
    - ``L_local``: for each batch-hard triplet (``BatchHardMiner`` on the descriptors) ``max(0, s(a, n) - s(a, p))``,
      summed, with ``s(x, y)`` the mean cosine of the mutual nearest neighbours above 0.7 between the two images'
      reliable-region local features;
    - ``KL``: between the confidence ``C`` and the importance ``I`` (attention), each with the other side detached;
    - ``L_sep``: per image and a random other image of its place, the local features summed inside the region
      weights (foreground) and outside them (background), compared by ``0.7 (1 - cos_fg) + 0.3 (1 - cos_bg)``
      (local features detached: only the weights train), averaged over the batch;
    - ``L_ws`` (weak supervision): per image and the next image of its place, up to 5 patch pairs found on the
      backbone's patch features (attention-guided anchors, same cluster, cosine > 0.8 and twice the runner-up);
      ``1 - cos`` of the 3 x 3 mean local features around the two patches' centres, weighted by the pair's
      cosine x 0.01, averaged over the pairs.

    Differences from upstream, degenerate cases only: an image pair without any match above 0.7 gets the
    row-aligned mean similarity (upstream's fallback for one match; it averages an empty set, NaN, for none);
    a 3 x 3 window at the border is clipped (upstream's indices would wrap, never at 322 px).
    """

    #: the training module calls it with the head's :class:`FoLOutputs`, not the descriptors alone
    reads_head_outputs = True
    #: upstream constants: KL weight, local match threshold, foreground weight, weak-supervision thresholds
    kl_weight, match_similarity, foreground_weight = 5e-3, 0.7, 0.7
    anchor_floor, assignment_floor, pair_similarity, pair_ratio, pairs_per_image, ws_scale = 0.1, 0.1, 0.8, 2.0, 5, 1e-2

    def __init__(self, metric: nn.Module) -> None:
        super().__init__()
        self.metric = metric
        self.triplets = BatchHardMiner()
        self.last_terms: dict[str, float] = {}

    @property
    def last_mined_fraction(self) -> float:
        return float(getattr(self.metric, "last_mined_fraction", 1.0))

    def forward(self, outputs: FoLOutputs, labels: Tensor) -> Tensor:
        with torch.autocast(device_type=labels.device.type, enabled=False):
            terms = {
                "global": self.metric(outputs.descriptor.float(), labels),
                "local": self.local_triplets(outputs.descriptor.float(), outputs.local.float(), labels),
                "kl": self.kl_weight * self.kl_terms(outputs.confidence.float(), outputs.importance.float()),
                "separation": self.separation(outputs.dense_local.float(), outputs.region_weights.float(), labels,
                                              outputs.grid),
                "weak": self.weak_supervision(outputs, labels),
            }
        self.last_terms = {name: float(value.detach()) for name, value in terms.items()}
        return sum(terms.values())  # type: ignore[return-value]

    def match_similarity_of(self, x: Tensor, y: Tensor) -> Tensor:
        """``x: [L, l]``, ``y: [M, l]`` (unit or zero rows) -> mean cosine of their mutual nearest neighbours above
        :attr:`match_similarity` (differentiable in the matched values)."""
        sims = y @ x.T                                       # [M, L]
        best_y = sims.argmax(dim=0)                          # [L]
        mutual = sims.argmax(dim=1)[best_y] == torch.arange(x.shape[0], device=x.device)
        values = sims[best_y, torch.arange(x.shape[0], device=x.device)]
        keep = mutual & (values > self.match_similarity)
        if int(mutual.sum()) == 1 or not bool(keep.any()):
            rows = min(x.shape[0], y.shape[0])
            return (x[:rows] * y[:rows]).sum(-1).mean()
        return values[keep].mean()

    def local_triplets(self, descriptors: Tensor, local: Tensor, labels: Tensor) -> Tensor:
        anchors, positives, negatives = self.triplets(descriptors.detach(), labels)
        total = local.sum() * 0.0
        for a, p, n in zip(anchors.tolist(), positives.tolist(), negatives.tolist()):
            gap = self.match_similarity_of(local[a], local[n]) - self.match_similarity_of(local[a], local[p])
            total = total + gap.clamp(min=0)
        return total

    @staticmethod
    def kl_terms(confidence: Tensor, importance: Tensor) -> Tensor:
        """``KL(I.detach || C) + KL(C.detach || I)``, each summed over patches and averaged over the batch."""
        def kl(target: Tensor, prediction: Tensor) -> Tensor:
            return (target * (target.log() - prediction.log())).sum(-1).mean()
        return kl(importance.detach(), confidence) + kl(confidence.detach(), importance)

    def separation(self, dense_local: Tensor, region_weights: Tensor, labels: Tensor, grid: tuple[int, int]) -> Tensor:
        batch, out_h, out_w, _ = dense_local.shape
        weights = F.interpolate(region_weights.reshape(batch, 1, *grid), size=(out_h, out_w), mode="bilinear",
                                align_corners=True)[:, 0]                                   # [B, H', W']
        local = dense_local.detach()
        foreground = F.normalize((local * weights.unsqueeze(-1)).sum((1, 2)), dim=-1)        # [B, l]
        background = F.normalize((local * (1 - weights).unsqueeze(-1)).sum((1, 2)), dim=-1)
        total = foreground.sum() * 0.0
        for i, group in enumerate(_place_groups(labels)):
            others = [j for j in group if j != i]
            if not others:
                continue
            j = others[int(torch.randint(len(others), ()))]
            cos_fg = (foreground[i] * foreground[j]).sum()
            cos_bg = (background[i] * background[j]).sum()
            loss = self.foreground_weight * (1 - cos_fg) + (1 - self.foreground_weight) * (1 - cos_bg)
            total = total + loss / batch
        return total

    def _window_mean(self, dense: Tensor, patch: int, grid: tuple[int, int]) -> Tensor:
        """Mean of the 3 x 3 local features around the centre of ``patch`` mapped onto the ``[H', W', l]`` grid."""
        out_h, out_w = dense.shape[:2]
        row = round((patch // grid[1] + 0.5) * out_h / grid[0])
        col = round((patch % grid[1] + 0.5) * out_w / grid[1])
        window = dense[max(row - 1, 0):row + 2, max(col - 1, 0):col + 2]
        return window.reshape(-1, dense.shape[-1]).sum(0) / 9

    def weak_pairs(self, f1: Tensor, f2: Tensor, p1: Tensor, p2: Tensor, guidance: Tensor) -> list[tuple[int, int, float]]:
        """Up to :attr:`pairs_per_image` ``(patch in image 1, patch in image 2, cosine)`` pairs; ``f: [C, n]`` unit
        patch features, ``p: [m, n]`` assignments, ``guidance: [n]`` of image 1."""
        anchors = torch.nonzero(guidance > self.anchor_floor).flatten()[1:]  # upstream skips the first one
        if anchors.numel() < 1:
            return []
        clusters = p1[:, anchors].argmax(dim=0)                              # [a]
        allowed = p2[clusters] > self.assignment_floor                       # [a, n]
        sims = f1[:, anchors].T @ f2                                         # [a, n]
        sims = torch.where(allowed, sims, torch.full_like(sims, -10.0))
        top = sims.topk(2, dim=1)
        good = (top.values[:, 0] > self.pair_similarity) & (top.values[:, 0] / top.values[:, 1] > self.pair_ratio)
        pairs = zip(anchors[good].tolist(), top.indices[good, 0].tolist(), top.values[good, 0].tolist())
        return list(pairs)[: self.pairs_per_image]

    def weak_supervision(self, outputs: FoLOutputs, labels: Tensor) -> Tensor:
        patches, plan, guidance = outputs.patches.detach().float(), outputs.assignment.detach(), outputs.guidance
        dense, grid = outputs.dense_local.float(), outputs.grid
        total, count = dense.sum() * 0.0, 0
        for i, group in enumerate(_place_groups(labels)):
            if len(group) < 2:
                continue
            j = group[(group.index(i) + 1) % len(group)]
            pairs = self.weak_pairs(patches[i], patches[j], plan[i], plan[j], guidance[i].detach())
            for a, p, similarity in pairs:
                anchor, positive = self._window_mean(dense[i], a, grid), self._window_mean(dense[j], p, grid)
                total = total + (1 - F.cosine_similarity(anchor, positive, dim=0)) * similarity * self.ws_scale
            count += len(pairs)
        return total / count if count else total


class MarginLoss(nn.Module):
    """A classification loss with a margin and its own class weights: ``loss(descriptors [N, D],
    labels [N]) -> scalar``, labels in ``0 .. num_classes-1``.

    The losses are pytorch-metric-learning's ``ArcFaceLoss`` (Deng et al., CVPR 2019), ``CosFaceLoss``
    (Wang et al., CVPR 2018) and ``SubCenterArcFaceLoss`` (Deng et al., ECCV 2020), which hold the class
    weights ``W [D, num_classes]`` (``[D, num_classes * sub_centers]``). Those weights train with the
    model (they are in the training checkpoint, so a resumed run continues them) but are no part of
    the retrieval model: :func:`aggzoo.hub.checkpoint.unwrap_checkpoint`, export and ``save_pretrained``
    keep only ``model.*``. They get their own optimiser group (:func:`loss_parameter_groups`), with the
    learning rate and weight decay the recipe gives them.

    Units: pytorch-metric-learning's ArcFace margin is in **degrees** (``numpy.radians`` inside);
    CosFace's is a cosine offset. Configs state the paper's value and its unit beside the number.

    Args:
        loss: ``partial`` of the loss without its sizes (``conf/loss/arcface.yaml``); called with
            ``num_classes`` and ``embedding_size``.
        num_classes: ``C``, from the training data (:attr:`~aggzoo.data.class_batches.ClassImagesDataset.num_classes`).
        embedding_size: ``D``, the descriptor size (the model's ``out_dim``).
        lr_multiplier: the class weights' learning rate as a factor of the optimiser's.
        weight_decay: their weight decay (``None``: the optimiser's).
    """

    def __init__(self, loss: Callable[..., nn.Module], *, num_classes: int, embedding_size: int,
                 lr_multiplier: float = 1.0, weight_decay: float | None = 0.0) -> None:
        super().__init__()
        self.loss = loss(num_classes=num_classes, embedding_size=embedding_size)
        self.num_classes = num_classes
        self.lr_multiplier = float(lr_multiplier)
        self.weight_decay = weight_decay

    def forward(self, descriptors: Tensor, labels: Tensor) -> Tensor:
        # Cosines, margins and the scaled softmax in fp32 (scale ~45-64 makes half precision logits coarse).
        with torch.autocast(device_type=descriptors.device.type, enabled=False):
            return self.loss(descriptors.float(), labels)


def loss_parameter_groups(loss: nn.Module, *, base_lr: float) -> list[dict[str, Any]]:
    """The optimiser group of a loss's own trainable parameters (a :class:`MarginLoss`'s class weights),
    named ``loss``: ``[]`` for a loss without parameters (:class:`MetricLoss`)."""
    params = [p for p in loss.parameters() if p.requires_grad]
    if not params:
        return []
    group: dict[str, Any] = {"params": params, "lr": base_lr * float(getattr(loss, "lr_multiplier", 1.0)),
                             "name": "loss"}
    weight_decay = getattr(loss, "weight_decay", None)
    if weight_decay is not None:
        group["weight_decay"] = float(weight_decay)
    return [group]
