"""The VAE decode decision: a pure function over sizes and free memory."""

from __future__ import annotations

import pytest

from workers.diffusion_memory import decide_vae, decode_estimate_mb


@pytest.mark.parametrize("w, h, expected", [(512, 512, 1600), (1024, 1024, 6400),
                                            (256, 256, 400), (512, 1024, 3200)])
def test_estimate_is_linear_in_pixels(w, h, expected):
    assert decode_estimate_mb(w, h, 1600) == expected


@pytest.mark.parametrize("w, h, free, allow_cpu, mode", [
    (512, 512, None, True, "cpu-device"),     # no CUDA at all
    (512, 512, 4000, True, "gpu"),            # 1600 fits in 4000 - 512
    (1024, 1024, 8000, True, "gpu"),          # 6400 fits in 7488
    (1024, 1024, 4000, True, "tiled"),        # 6400 does not fit; tiles (1600) do
    (1024, 1024, 2000, True, "cpu"),          # tiles do not fit in 1488 either
    (1024, 1024, 2000, False, "tiled"),       # CPU decode not allowed: try tiled anyway
    (512, 512, 2112, True, "gpu"),            # exactly fits
    (512, 512, 2111, True, "cpu"),            # one MB short; tiles cost the same
])
def test_decision(w, h, free, allow_cpu, mode):
    decision = decide_vae(w, h, 1600, free, 512, allow_cpu)
    assert decision.mode == mode
    assert decision.estimated_mb == decode_estimate_mb(w, h, 1600)
    assert decision.reason
    assert decision.to_dict()["vae"] == mode
