"""Inputs nobody here wrote: English prose that ships on this machine, cut into sentences,
and the same sentences spoken by espeak-ng.

The prose is Python's Language Reference text (``pydoc_data.topics.topics``, in every CPython)
and the license texts every Debian system ships in ``/usr/share/common-licenses``.  Paragraphs
are split into sentences at a full stop,
question or exclamation mark followed by a capital; a sentence is kept when it has
``MIN_WORDS``-``MAX_WORDS`` words of plain letters (no code, no quotes), so espeak-ng reads it
as written.  :func:`sentences` picks ``n`` of them evenly spaced over the whole list (the same
ones every run).  :func:`clips` speaks them with espeak-ng (``en-us``, 150 words a minute,
22,050 Hz), resamples to 16 kHz and packs consecutive sentences into clips of at most
``MAX_SECONDS`` (Whisper pads every clip to 30 s, so each clip should carry several).

>>> [len(s.split()) >= MIN_WORDS for s in sentences(3)]
[True, True, True]
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

LICENSES = Path("/usr/share/common-licenses")
MIN_WORDS, MAX_WORDS = 6, 40
RATE = 16000                   # Whisper's sampling rate
ESPEAK_RATE = 22050            # espeak-ng's output rate
MAX_SECONDS = 28.0             # a clip's speech, inside Whisper's 30 s window
GAP_SECONDS = 0.4              # silence between the sentences of a clip
_PLAIN = re.compile(r"^[A-Z][A-Za-z0-9 ,;:'()\-]*[A-Za-z0-9)][.?!]$")
_SPLIT = re.compile(r"(?<=[.?!])\s+(?=[A-Z])")


def _paragraphs(text: str) -> list[str]:
    """The paragraphs of ``text`` (blocks between blank lines), each on one line, heading
    underlines left out (code lines fail the sentence filter)."""
    return [" ".join(line.strip() for line in block.split("\n")
                     if not re.fullmatch(r"[*=\-~^\s]+", line))
            for block in re.split(r"\n\s*\n", text)]


def sources() -> list[tuple[str, str]]:
    """(name, text) of every prose source, in a fixed order: the pydoc topics by key, then each
    license file once (by resolved path; a symlink such as GPL -> GPL-3 is read once)."""
    from pydoc_data.topics import topics

    found = [(f"pydoc:{k}", topics[k]) for k in sorted(topics)]
    seen = set()
    if LICENSES.is_dir():
        for p in sorted(LICENSES.iterdir()):
            real = p.resolve()
            if real in seen or not real.is_file():
                continue
            seen.add(real)
            found.append((f"license:{p.name}", real.read_text(errors="replace")))
    return found


def all_sentences() -> list[str]:
    """Every plain English sentence of :func:`sources`, in source order, each once."""
    out: list[str] = []
    seen: set[str] = set()
    for _, text in sources():
        for para in _paragraphs(text):
            for s in _SPLIT.split(re.sub(r"\s+", " ", para).strip()):
                if (MIN_WORDS <= len(s.split()) <= MAX_WORDS and _PLAIN.match(s)
                        and s not in seen):
                    seen.add(s)
                    out.append(s)
    return out


def sentences(n: int) -> list[str]:
    """``n`` sentences of :func:`all_sentences`, evenly spaced over the list (deterministic)."""
    pool = all_sentences()
    if not 1 <= n <= len(pool):
        raise ValueError(f"asked for {n} sentences; the prose on this machine has {len(pool)}")
    return [pool[(i * len(pool)) // n] for i in range(n)]


def require_espeak() -> str:
    """The espeak-ng executable, or a one-line error naming how to install it."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise SystemExit("espeak-ng is not installed: the Whisper study speaks its sentences "
                         "with it (apt-get install espeak-ng)")
    return exe


def speak(text: str) -> np.ndarray:
    """``text`` spoken by espeak-ng (en-us, 150 words a minute) as float32 samples at 16 kHz."""
    from scipy.signal import resample_poly

    exe = require_espeak()
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "out.wav"
        subprocess.run([exe, "-v", "en-us", "-s", "150", "-w", str(wav), text], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        with wave.open(str(wav)) as w:
            if w.getframerate() != ESPEAK_RATE or w.getsampwidth() != 2 or w.getnchannels() != 1:
                raise ValueError(f"espeak-ng wrote {w.getframerate()} Hz, {w.getsampwidth()}-byte"
                                 f", {w.getnchannels()}-channel audio; expected 22050 Hz mono "
                                 "16-bit")
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    audio = pcm.astype(np.float64) / 32768.0
    return resample_poly(audio, 320, 441).astype(np.float32)      # 22050 -> 16000 Hz


@dataclass(frozen=True)
class Clip:
    """Consecutive sentences spoken one after the other (``audio`` at 16 kHz)."""

    sentences: tuple[str, ...]
    audio: np.ndarray

    @property
    def text(self) -> str:
        return " ".join(self.sentences)


def clips(texts: list[str], max_seconds: float = MAX_SECONDS) -> list[Clip]:
    """``texts`` spoken and packed in order into clips of at most ``max_seconds`` (a sentence
    longer than that alone is an error)."""
    gap = np.zeros(int(GAP_SECONDS * RATE), np.float32)
    out: list[Clip] = []
    held: list[str] = []
    parts: list[np.ndarray] = []
    for s in texts:
        audio = speak(s)
        if len(audio) > max_seconds * RATE:
            raise ValueError(f"sentence of {len(audio) / RATE:.1f} s is longer than a clip "
                             f"({max_seconds} s): {s[:60]!r}")
        if held and sum(map(len, parts)) + len(gap) + len(audio) > max_seconds * RATE:
            out.append(Clip(tuple(held), np.concatenate(parts)))
            held, parts = [], []
        parts += [gap, audio] if held else [audio]
        held.append(s)
    if held:
        out.append(Clip(tuple(held), np.concatenate(parts)))
    return out
