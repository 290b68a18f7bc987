"""AffineWhitening and pca_whitening_projection against scikit-learn's PCA (an independent implementation)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA

from aggzoo.layers.whitening import AffineWhitening, pca_whitening_projection


def _fitted(whiten: bool) -> tuple[PCA, np.ndarray]:
    rng = np.random.default_rng(0)
    train = rng.standard_normal((200, 6)) @ rng.standard_normal((6, 6)) + rng.standard_normal(6)
    return PCA(n_components=4, whiten=whiten).fit(train), rng.standard_normal((5, 6))


def test_full_whitening_is_sklearns_transform() -> None:
    pca, x = _fitted(whiten=True)
    layer = AffineWhitening(6, 4).double()
    projection = pca_whitening_projection(torch.from_numpy(pca.components_), torch.from_numpy(pca.explained_variance_))
    layer.set_whitening(projection, torch.from_numpy(pca.mean_))
    ours = layer(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(ours, pca.transform(x), rtol=1e-10, atol=1e-10)


def test_plain_projection_and_power() -> None:
    pca, x = _fitted(whiten=False)
    components, variance = torch.from_numpy(pca.components_), torch.from_numpy(pca.explained_variance_)
    layer = AffineWhitening(6, 4).double()
    layer.set_whitening(pca_whitening_projection(components, None), torch.from_numpy(pca.mean_))
    np.testing.assert_allclose(layer(torch.from_numpy(x)).detach().numpy(), pca.transform(x), rtol=1e-10, atol=1e-10)
    # power 0.25, multiplier 2: each output axis j is the plain projection divided by 2 * lambda_j ** 0.25
    layer.set_whitening(pca_whitening_projection(components, variance, power=0.25, multiplier=2.0),
                        torch.from_numpy(pca.mean_))
    expected = pca.transform(x) / (2.0 * pca.explained_variance_ ** 0.25)
    np.testing.assert_allclose(layer(torch.from_numpy(x)).detach().numpy(), expected, rtol=1e-10, atol=1e-10)


def test_shapes_are_checked() -> None:
    layer = AffineWhitening(6, 4)
    with pytest.raises(ValueError, match="projection of shape"):
        layer.set_whitening(torch.zeros(6, 4), torch.zeros(6))
    with pytest.raises(ValueError, match="mean of shape"):
        layer.set_whitening(torch.zeros(4, 6), torch.zeros(4))
    with pytest.raises(ValueError, match="does not match"):
        pca_whitening_projection(torch.zeros(4, 6), torch.ones(3))
