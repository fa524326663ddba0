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


def test_search_is_approximate_from_the_measured_size_or_as_the_flag_forces(tmp_path: Path,
                                                                            make_predictor) -> None:
    """--search auto searches exactly below the size measured per store (``prvr.index.APPROXIMATE_FROM``) and
    approximately from it; exact / approximate force either; /info and the info panel say which and why; a
    bad value is refused in one line naming it."""
    from prvr.index import APPROXIMATE_FROM, SEARCH_MODES, search_mode
    from prvr.serve import settings
    from prvr.serve.page import info_markdown

    assert settings.SEARCH_MODES == SEARCH_MODES  # the flag's choices are the index's (settings: stdlib only)
    for backend, start in APPROXIMATE_FROM.items():
        assert not search_mode("auto", start - 1, backend).approximate
        assert search_mode("auto", start, backend).approximate
        assert search_mode("exact", 10 * start, backend) == (False, "exact search asked for (--search exact)")
        assert search_mode("approximate", 0, backend).approximate
    with pytest.raises(ValueError, match="search must be one of auto, exact, approximate, got 'fast'"):
        AppSettings(data_dir=tmp_path, search="fast")
    flagged = AppSettings.from_args(["--search", "approximate", "--data-dir", str(tmp_path)])
    assert flagged.search == "approximate"
    auto = make_predictor(tmp_path / "auto")  # an empty gallery: exact, and says why
    assert auto.describe()["search"] == {"approximate": False, "why": search_mode("auto", 0, "built-in").why}
    assert f"**Search:** exact: 0 videos, fewer than {APPROXIMATE_FROM['built-in']}" in info_markdown(
        auto.describe())
    assert auto.search("a dog", k=5).approximate is False
    forced = make_predictor(tmp_path / "forced", search="approximate")
    assert forced.describe()["search"]["approximate"] and forced.search("a dog", k=5).approximate is True
