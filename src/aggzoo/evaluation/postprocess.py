"""Descriptor post-processing at test time: PCA-whitening and SuperGlobal reranking.

PCA-whitening (Jegou & Chum, "Negative evidences and co-occurrences in image retrieval", ECCV 2012):
fit on descriptors of a *training* set (never the benchmark), ``y = L2(diag(lambda + eps)^(-1/2) U_d^T (x - mu))``
with ``U_d`` the top-``d`` eigenvectors of the covariance. It reduces the dimension and spreads the variance
that a few directions hog.

:data:`WHITENING_KINDS`: ``"whiten"`` is that (the default); ``"project"`` is the plain PCA projection
``y = U_d^T (x - mu)`` with neither whitening nor a final L2 -- what sklearn's ``PCA(d).transform`` gives
(``whiten=False``, its default), the ``--pca_dim`` of gmberton/deep-visual-geo-localization-benchmark and of
Lu-Feng/CricaVPR (``util.compute_pca``: fit on the descriptors of at most 2^14 training images, e.g.
``pitts30k/images/train``; ``test.py`` projects both sets and searches them with ``faiss.IndexFlatL2``). Its
outputs are not unit-norm, so it is searched by L2 distance there (``evaluation.search.metric=l2``).

SuperGlobal reranking (Shao et al., "Global Features are All You Need for Image Retrieval and Reranking",
ICCV 2023, arXiv:2308.06954; ShihaoShao-GH/SuperGlobal ``modules/reranking/{MDescAug,RerankwMDA}.py``, MIT),
re-implemented from its code's math. For a query ``q`` with global top-``M`` candidates ``x_1..x_M``:

1. database-side refinement: each candidate is replaced by the weighted average of its ``K + 1`` nearest
   candidates (itself first, weight 1; the other ``K`` weighted ``beta * x_i . x_j``), ``x'_i`` (not renormalised);
   the candidates are re-ordered by ``s'_i = q . x'_i``;
2. query expansion by maximum: ``q' = max_elementwise`` of the first ``K + 1`` refined candidates in that
   order; the final score is ``(s'_i + q' . x'_i) / 2``.

Candidates past ``M`` keep their global order. Defaults as upstream: ``M = 400``, ``K = 9`` (10 neighbours
including oneself), ``beta = 0.15``. Upstream computes ``beta``-weights for step 2 but never uses them; we
follow the code (the published numbers come from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aggzoo.errors import ConfigError
from aggzoo.evaluation.options import check_metric

__all__ = ["PCAWhitening", "SuperGlobalRerank", "WHITENING_KINDS", "check_whitening_kind", "rerank_metric_check"]

#: ``evaluation.postprocess.whitening_kind`` -> the :meth:`PCAWhitening.fit` options it stands for
WHITENING_KINDS = {"whiten": {"whiten": True, "l2": True}, "project": {"whiten": False, "l2": False}}


def check_whitening_kind(kind: str) -> str:
    """``kind`` if it is one of :data:`WHITENING_KINDS`, else one :class:`ConfigError`."""
    if kind not in WHITENING_KINDS:
        raise ConfigError(f"evaluation.postprocess.whitening_kind={kind!r} is not one of {', '.join(WHITENING_KINDS)} (whiten: "
                          "PCA-whitening + L2; project: the plain PCA projection, no L2, as sklearn's PCA)")
    return kind


@dataclass
class PCAWhitening:
    """A fitted PCA(-whitening): ``[N, D] -> [N, d]``, L2-normalised unless ``l2`` is false.

    Attributes:
        mean: ``[D]`` training mean ``mu``.
        projection: ``[D, d]`` ``U_d diag(lambda_d + eps)^(-1/2)`` (or ``U_d`` without whitening).
        eigenvalues: ``[d]`` variances along the kept directions.
        l2: L2-normalise the outputs (false: the projection as it is, sklearn's ``PCA.transform``).
    """

    mean: np.ndarray
    projection: np.ndarray
    eigenvalues: np.ndarray
    l2: bool = True

    @property
    def in_dim(self) -> int:
        return self.projection.shape[0]

    @property
    def out_dim(self) -> int:
        return self.projection.shape[1]

    @classmethod
    def fit(
        cls, descriptors: np.ndarray, dim: int | None = None, *, whiten: bool = True, eps: float = 1e-6,
        l2: bool = True, chunk: int = 16384,
    ) -> PCAWhitening:
        """Fit on ``[N, D]`` training descriptors.

        Args:
            dim: kept dimensions ``d`` (default ``min(N - 1, D)``, the non-degenerate ones).
            whiten: scale each direction by ``(lambda + eps)^(-1/2)``; false: the plain projection.
            eps: regulariser added to each eigenvalue, relative to the largest one (keeps
                near-null directions from blowing up).
            l2: L2-normalise the outputs.
        """
        x = np.asarray(descriptors)
        n, d_in = x.shape
        max_dim = min(n - 1, d_in)
        dim = max_dim if dim is None else int(dim)
        if not 1 <= dim <= max_dim:
            raise ValueError(
                f"PCA dim must be in [1, {max_dim}] for {n} training descriptors of size {d_in}, got {dim}")
        mean = x.mean(axis=0, dtype=np.float64)
        cov = np.zeros((d_in, d_in), dtype=np.float64)
        for start in range(0, n, chunk):  # float64 covariance without a float64 copy of all of x
            block = x[start:start + chunk].astype(np.float64) - mean
            cov += block.T @ block
        cov /= n
        eigenvalues, eigenvectors = np.linalg.eigh(cov)
        order = np.argsort(eigenvalues)[::-1][:dim]
        eigenvalues, eigenvectors = np.clip(eigenvalues[order], 0.0, None), eigenvectors[:, order]
        # Fix each axis' sign (largest-magnitude component positive) so fits are reproducible.
        signs = np.sign(eigenvectors[np.abs(eigenvectors).argmax(axis=0), np.arange(dim)])
        eigenvectors *= np.where(signs == 0, 1.0, signs)
        scale = 1.0 / np.sqrt(eigenvalues + eps * eigenvalues[0]) if whiten else np.ones(dim)
        return cls(mean=mean.astype(np.float32), projection=(eigenvectors * scale).astype(np.float32),
                   eigenvalues=eigenvalues.astype(np.float32), l2=bool(l2))

    def __call__(self, descriptors: np.ndarray, *, chunk: int = 65536) -> np.ndarray:
        """``[N, D] -> [N, d]``, rows L2-normalised (if :attr:`l2`), in blocks (float16 input stays float16
        outside one block)."""
        x = np.asarray(descriptors)
        if x.ndim != 2 or x.shape[1] != self.in_dim:
            raise ValueError(f"PCA-whitening fitted on {self.in_dim}-D descriptors, got shape {x.shape}")
        out = np.empty((len(x), self.out_dim), dtype=np.float32)
        for start in range(0, len(x), chunk):
            y = (x[start:start + chunk].astype(np.float32) - self.mean) @ self.projection
            out[start:start + chunk] = y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12) if self.l2 else y
        return out.astype(x.dtype if x.dtype == np.float16 else np.float32, copy=False)

    def save(self, path: str | Path) -> Path:
        """Write an ``.npz`` (arrays only, loadable without pickle)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, mean=self.mean, projection=self.projection, eigenvalues=self.eigenvalues, l2=np.bool_(self.l2))
        return path

    @classmethod
    def load(cls, path: str | Path) -> PCAWhitening:
        """Read a :meth:`save` file (one written before ``l2`` existed normalises, as they all did then)."""
        with np.load(path, allow_pickle=False) as data:
            l2 = bool(data["l2"]) if "l2" in data.files else True
            return cls(mean=data["mean"], projection=data["projection"], eigenvalues=data["eigenvalues"], l2=l2)


@dataclass(frozen=True)
class SuperGlobalRerank:
    """SuperGlobal reranking of the global top-``top_m`` (see the module docstring).

    Args:
        top_m: ``M``, candidates re-ranked per query.
        k: ``K``, neighbours averaged into each candidate besides itself (and the ``K + 1`` refined
            candidates max-pooled into the expanded query).
        beta: weight scale of the neighbours.
        query_chunk: queries processed together (memory ``~ query_chunk * M * (2M + 2D)`` floats).
    """

    top_m: int = 400
    k: int = 9
    beta: float = 0.15
    query_chunk: int = 16

    def __call__(self, database: np.ndarray, queries: np.ndarray, predictions: np.ndarray,
                 device: torch.device | str | None = None) -> np.ndarray:
        """Re-rank ``predictions [Q, K_pred]`` (global order, ``K_pred >= min(M, N_db)``); returns the same shape."""
        predictions = np.asarray(predictions)
        m = min(self.top_m, predictions.shape[1])
        neighbours = min(self.k + 1, m)
        device = torch.device(device) if device is not None else torch.device("cpu")
        out = predictions.copy()
        for start in range(0, len(queries), self.query_chunk):
            ids = torch.from_numpy(predictions[start:start + self.query_chunk, :m])
            x = torch.from_numpy(np.asarray(database)[ids.numpy().reshape(-1)].astype(np.float32))
            x = x.view(*ids.shape, -1).to(device)                                 # [b, M, D]
            q = torch.from_numpy(np.asarray(queries[start:start + self.query_chunk], dtype=np.float32)).to(device)
            # 1. each candidate <- weighted mean of its K+1 nearest candidates (itself first, weight 1)
            sims = torch.einsum("bmd,bnd->bmn", x, x)                             # [b, M, M]
            top_sim, top_idx = sims.topk(neighbours, dim=-1)                      # [b, M, K+1]
            weights = torch.cat([torch.ones_like(top_sim[..., :1]), self.beta * top_sim[..., 1:]], dim=-1)
            # As a sparse [M, M] averaging matrix: no [b, M, K+1, D] gather.
            mixing = torch.zeros_like(sims).scatter_(-1, top_idx, weights / weights.sum(-1, keepdim=True))
            refined = mixing @ x                                                  # [b, M, D]
            score = torch.einsum("bd,bmd->bm", q, refined)                       # s'
            order = torch.argsort(score, dim=1, descending=True, stable=True)
            refined = torch.take_along_dim(refined, order.unsqueeze(-1), dim=1)
            score = torch.take_along_dim(score, order, dim=1)
            # 2. expanded query: elementwise max of the first K+1 refined candidates
            expanded = refined[:, :neighbours].max(dim=1).values                 # [b, D]
            final = (score + torch.einsum("bd,bmd->bm", expanded, refined)) / 2
            final_order = torch.argsort(final, dim=1, descending=True, stable=True)
            reordered = torch.take_along_dim(ids.to(device), torch.take_along_dim(order, final_order, dim=1), dim=1)
            out[start:start + self.query_chunk, :m] = reordered.cpu().numpy()
        return out


def rerank_metric_check(rerank: Any, metric: str) -> None:
    """Refuse a re-ranker that scores by inner products (SuperGlobal) after an L2 search: it would
    re-order the L2 shortlist by another metric. Re-rankers that score something else (instance tokens,
    local-feature matches) take any shortlist."""
    if check_metric(metric) == "l2" and isinstance(rerank, SuperGlobalRerank):
        raise ConfigError("evaluation.rerank.method=superglobal re-scores the shortlist by inner products of the global "
                          "descriptors, but evaluation.search.metric=l2 ranks by L2 distance: set "
                          "evaluation.search.metric=ip, or drop the re-ranking (evaluation.rerank.method=null)")
