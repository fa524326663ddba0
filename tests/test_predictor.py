"""The predictor's wiring: where its files go."""

from __future__ import annotations

from pathlib import Path

import pytest

from prvr.models import bridge
from prvr.serve.model_choice import load_model
from prvr.serve.settings import AppSettings


def test_bridge_class_embeddings_land_in_the_data_dir(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """--data-dir holds everything the app writes (one folder to move, clean or put on fast disk): the
    training-free model's class-embedding cache too, not ~/.cache."""
    home_cache = tmp_path / "home-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home_cache))
    loaded = load_model(AppSettings(data_dir=tmp_path / "data", host="127.0.0.1"))
    assert loaded.profile.name == bridge.PROFILE and isinstance(loaded.model, bridge.BridgeModel)
    assert list((tmp_path / "data" / "bridge").glob("classes-*.npy"))
    assert not home_cache.exists()
