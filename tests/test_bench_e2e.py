"""`python -m poad_jax.bench e2e --versus=...`: the second side's arguments."""

from __future__ import annotations

import pytest

from poad_jax.bench.e2e import versus_argv


def test_versus_appends_overrides_and_drops_side_by_side_flags():
    argv = ["--config=configs/virtualhome.py", "--versus=config.method=twosome", "--updates=2", "--rounds=3"]
    assert versus_argv(argv, "config.method=twosome, share_prompt=false") == [
        "--config=configs/virtualhome.py", "--updates=2", "--config.method=twosome", "--share_prompt=false"]


def test_versus_items_must_be_key_value():
    with pytest.raises(ValueError, match="key=value"):
        versus_argv(["--updates=2"], "config.method")
