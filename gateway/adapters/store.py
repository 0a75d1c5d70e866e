"""The adapter store: uploaded PEFT adapters as files under one directory, content-addressed.

    {root}/{digest}/adapter_config.json
    {root}/{digest}/adapter_model.safetensors

``digest`` is the sha256 of the two files' own sha256 digests (config, then weights): the same
files uploaded twice, by one tenant or two, are one folder. A folder appears whole or not at all
(written beside it, then renamed), so a worker never reads half an upload. Gateways write it,
workers read it: in a deployment of several machines ``root`` is a shared filesystem.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import BinaryIO

from engine.assets import cache_dir
from engine.lora import CONFIG_FILE, WEIGHTS_FILE

DIGEST = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20


def default_adapter_dir() -> Path:
    """Where adapters live unless ``adapter_dir`` is set: beside the converted models."""
    return cache_dir() / "adapters"


def adapter_digest(config_sha256: bytes, weights_sha256: bytes) -> str:
    return hashlib.sha256(config_sha256 + weights_sha256).hexdigest()


class AdapterStore:
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def path(self, digest: str) -> Path:
        """The PEFT folder of a digest (which may not exist)."""
        if not DIGEST.match(digest):
            raise ValueError(f"not an adapter digest: {digest!r}")
        return self.root / digest

    def exists(self, digest: str) -> bool:
        folder = self.path(digest)
        return (folder / CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()

    def put(self, config: bytes, weights: BinaryIO) -> str:
        """Store the two files (``weights`` read from its start, in chunks); returns their digest."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".upload-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            (tmp / CONFIG_FILE).write_bytes(config)
            weights_hash = hashlib.sha256()
            weights.seek(0)
            with open(tmp / WEIGHTS_FILE, "wb") as out:
                while chunk := weights.read(CHUNK):
                    weights_hash.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            digest = adapter_digest(hashlib.sha256(config).digest(), weights_hash.digest())
            if not self.exists(digest):
                try:
                    os.replace(tmp, self.path(digest))
                except OSError:  # a concurrent upload of the same files renamed first: theirs is ours
                    if not self.exists(digest):
                        raise
            return digest
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def remove(self, digest: str) -> None:
        """Delete a digest's folder (renamed away first, so no reader sees it half removed)."""
        folder = self.path(digest)
        trash = self.root / f".removed-{digest}-{uuid.uuid4().hex[:8]}"
        try:
            os.replace(folder, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def digests(self) -> list[str]:
        """Every stored digest (tests and operators: what is on disk)."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if DIGEST.match(p.name))
