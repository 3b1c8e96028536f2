"""A manifest file that is a folder (space.toml, a member.toml) is a ManifestError naming
it, and an archive carrying one is refused with a 4xx on New space, nothing written. Found by
bench/attack.py: IsADirectoryError came out of manifest._text_file as a 500."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from django.conf import settings

from veronica.portable import archive as portable, manifest
from veronica.plumbing.errors import VeronicaError
from veronica.models import Space


def _as_folder(root: Path, name: str) -> None:
    (root / name).unlink()
    (root / name).mkdir()


@pytest.mark.parametrize("name", ["space.toml", "members/lead/member.toml"])
def test_a_manifest_file_that_is_a_folder_is_named(db, demo_manifest, name):
    _as_folder(demo_manifest, name)
    with pytest.raises(manifest.ManifestError) as caught:
        manifest.load(demo_manifest)
    assert Path(name).name in str(caught.value) and "folder" in str(caught.value)
    assert not Space.objects.exists()


def _archive(root: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(root.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return buf.getvalue()


def test_an_archive_whose_space_toml_is_a_folder_is_refused_and_writes_nothing(db, demo_manifest):
    _as_folder(demo_manifest, "space.toml")
    with pytest.raises(VeronicaError) as caught:
        portable.create_from_archive(_archive(demo_manifest), "folder-toml")
    assert caught.value.status < 500 and "space.toml" in caught.value.message
    assert not Space.objects.exists() and not (Path(settings.DATA_DIR) / "spaces" / "folder-toml").exists()
