"""The VAE decode policy: pure functions over image sizes and free memory."""

from __future__ import annotations

import pytest

from workers.diffusers.memory import (
    VaeDecision,
    VaeMode,
    decide_vae,
    decode_estimate_mb,
    oom_fallback,
)


@pytest.mark.parametrize("w, h, expected", [
    (512, 512, 1600), (1024, 1024, 6400), (256, 256, 400), (512, 1024, 3200), (64, 64, 25)])
def test_estimate_is_linear_in_pixels(w, h, expected):
    assert decode_estimate_mb(w, h, 1600) == expected


@pytest.mark.parametrize("w, h, coeff, free, margin, allow_cpu, mode", [
    (512, 512, 1600, None, 512, True, VaeMode.CPU_DEVICE),   # no CUDA at all
    (4096, 4096, 1600, None, 512, False, VaeMode.CPU_DEVICE),  # size does not matter then
    (512, 512, 1600, 4000, 512, True, VaeMode.GPU),          # 1600 fits in 3488
    (1024, 1024, 1600, 8000, 512, True, VaeMode.GPU),        # 6400 fits in 7488
    (512, 512, 1600, 2112, 512, True, VaeMode.GPU),          # exactly fits
    (1024, 1024, 1600, 4000, 512, True, VaeMode.TILED),      # 6400 does not fit; 1600 tiles do
    (1024, 1024, 1600, 2112, 512, True, VaeMode.TILED),      # tiles exactly fit
    (1024, 1024, 1600, 2111, 512, True, VaeMode.CPU),        # tiles one MB short
    (1024, 1024, 1600, 2000, 512, False, VaeMode.TILED),     # CPU decode off: tiled anyway
    (512, 512, 1600, 2111, 512, True, VaeMode.CPU),          # one tile is the whole image
    (256, 256, 1600, 1000, 512, True, VaeMode.GPU),          # 400 fits in 488
    (1024, 1024, 800, 4000, 0, True, VaeMode.GPU),           # a lighter VAE: 3200 fits
    (512, 512, 1600, 100000, 99000, True, VaeMode.CPU),      # a huge margin eats the room
    (512, 512, 1600, 300, 512, True, VaeMode.CPU),           # margin above free: no room
])
def test_decision(w, h, coeff, free, margin, allow_cpu, mode):
    decision = decide_vae(w, h, coeff, free, margin, allow_cpu)
    assert decision.mode is mode
    assert decision.estimated_mb == decode_estimate_mb(w, h, coeff)
    assert decision.reason


def test_decision_unpacks_and_reports():
    mode, estimated_mb, reason = decide_vae(1024, 1024, 1600, 4000, 512, True)
    assert (mode, estimated_mb) == ("tiled", 6400) and "6400 MB" in reason
    report = VaeDecision(mode, estimated_mb, reason).report(free_mb=4000)
    assert report == {"vae": "tiled", "estimated_decode_mb": 6400, "free_mb": 4000,
                      "reason": reason}


@pytest.mark.parametrize("mode, allow_cpu, can_move_vae, retry", [
    (VaeMode.GPU, True, True, VaeMode.TILED),
    (VaeMode.GPU, False, False, VaeMode.TILED),
    (VaeMode.TILED, True, True, VaeMode.CPU),
    (VaeMode.TILED, False, True, None),       # CPU decode off
    (VaeMode.TILED, True, False, None),       # offload hooks own the VAE
    (VaeMode.CPU, True, True, None),          # the CPU does not run out of CUDA memory
    (VaeMode.CPU_DEVICE, True, True, None),
])
def test_one_retry_after_cuda_oom(mode, allow_cpu, can_move_vae, retry):
    assert oom_fallback(mode, allow_cpu, can_move_vae) == retry
