"""Publishing a model to the Hugging Face Hub: :func:`push_to_hub`.

The folder :func:`aggzoo.hub.saving.save_pretrained` writes (``config.json``, ``model.safetensors``,
``README.md``) is uploaded as one commit with huggingface_hub's :class:`~huggingface_hub.HfApi`
(``create_repo`` + ``upload_folder``), so its token (``HF_TOKEN`` or ``hf auth login``) and endpoint
(``HF_ENDPOINT``) rules apply. ``aggzoo.create_model("hf-hub:<owner>/<repo>")`` loads it back.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any

from huggingface_hub import CommitInfo, HfApi
from huggingface_hub.errors import HfHubHTTPError, HFValidationError
from torch import nn

from aggzoo.errors import PublishError
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.saving import save_pretrained

__all__ = ["push_to_hub"]


def push_to_hub(
    model: nn.Module,
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    commit_message: str = "Upload aggzoo model",
    spec: Mapping[str, Any] | None = None,
    pretrained_cfg: PretrainedCfg | None = None,
    run_summary: str | os.PathLike | None = None,
    test_results: str | os.PathLike | None = None,
    license: str | None = None,
) -> CommitInfo:
    """Save ``model`` as a model repository folder (:func:`~aggzoo.hub.saving.save_pretrained`, with its
    card) and upload it to ``repo_id`` (``<owner>/<repo>``, created if it does not exist).

    Args:
        private: visibility of a repository this call creates (``None``: the Hub's default).
        token: a Hugging Face token (default: ``HF_TOKEN``, else the one ``hf auth login`` saved).
        revision: the branch to commit to (default ``main``).
        spec, pretrained_cfg, run_summary, test_results, license: as :func:`~aggzoo.hub.saving.save_pretrained`.

    Returns:
        huggingface_hub's :class:`~huggingface_hub.CommitInfo` (``.oid`` the commit, ``str()`` its URL).

    Raises:
        PublishError: the Hub refused (no or wrong token, no write access, invalid name).
    """
    with tempfile.TemporaryDirectory(prefix="aggzoo-push-") as folder:
        save_pretrained(model, folder, spec=spec, pretrained_cfg=pretrained_cfg, run_summary=run_summary,
                        test_results=test_results, license=license, repo_id=repo_id)
        api = HfApi(token=token)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            return api.upload_folder(folder_path=folder, repo_id=repo_id, repo_type="model", revision=revision,
                                     commit_message=commit_message)
        except (HfHubHTTPError, HFValidationError, ValueError) as error:
            # ValueError: huggingface_hub's "Invalid metadata in README.md" (the Hub validates the card).
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise PublishError(
                f"cannot push to {api.endpoint}/{repo_id} ({type(error).__name__}: {reason}). Check the name "
                "(<owner>/<repo>) and that your token may write there: set HF_TOKEN, pass token=, or run "
                "`hf auth login`."
            ) from None
