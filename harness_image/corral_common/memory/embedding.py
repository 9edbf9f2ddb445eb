"""Embeddings behind a protocol. The default is lexical and offline; see ADR 0022.

`HashedLexicalEmbedder` hashes word unigrams, word bigrams and character trigrams into a fixed
number of buckets, weights them with sublinear term frequency and L2-normalizes, so the cosine
of two vectors measures shared vocabulary. It needs no model files and no third-party package.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

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
        tokens = words(text)
        features: Counter[str] = Counter()
        features.update(f"w:{t}" for t in tokens)
        features.update(f"b:{a} {b}" for a, b in itertools.pairwise(tokens))
        for t in tokens:
            padded = f"#{t}#"
            features.update(f"c:{padded[i : i + 3]}" for i in range(max(1, len(padded) - 2)))
        vector = [0.0] * self.dims
        for feature, count in features.items():
            index, sign = _bucket(feature, self.dims)
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
