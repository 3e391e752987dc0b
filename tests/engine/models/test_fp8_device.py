"""FP8 on a GPU that cannot compute with e4m3 (compute capability below 8.9) is refused before
anything loads, naming each FP8 setting and what to set instead (engine/models/fp8.py's
check_fp8_device); GPUs from 8.9 on, and the CPU, are let through."""

from __future__ import annotations

import pytest
import torch

from shardinfer.engine.models.fp8 import check_fp8_device
from shardinfer.errors import EXIT_CONFIG, ModelLoadError

CUDA = torch.device("cuda", 0)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """A stand-in GPU whose capability the test sets (no CUDA is touched)."""
    capability = [(8, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability[0])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Test GPU")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return capability


def test_fp8_checkpoint_followed_on_an_old_gpu_names_quantization_none(gpu: list[tuple[int, int]]) -> None:
    with pytest.raises(ModelLoadError) as err:
        check_fp8_device(CUDA, None, "fp8", "auto")
    msg = str(err.value)
    assert "cuda:0 (Test GPU) has compute capability 8.0" in msg
    assert "checkpoint's weights are FP8" in msg and "quantization='none'" in msg
    assert 'model.quantization = "none"' in msg and "kv_cache_dtype" not in msg
    assert err.value.exit_code == EXIT_CONFIG


def test_every_fp8_setting_is_named_at_once(gpu: list[tuple[int, int]]) -> None:
    with pytest.raises(ModelLoadError) as err:
        check_fp8_device(CUDA, "fp8", "fp8", "fp8")
    msg = str(err.value)
    assert "quantization='fp8'" in msg and "quantization='none'" in msg
    assert "kv_cache_dtype='fp8'" in msg and 'engine.kv_cache_dtype = "auto"' in msg


def test_fp8_cache_alone_names_kv_cache_dtype_auto(gpu: list[tuple[int, int]]) -> None:
    with pytest.raises(ModelLoadError, match=r"kv_cache_dtype='fp8'.*kv_cache_dtype='auto'") as err:
        check_fp8_device(torch.device("cuda"), None, None, "fp8")
    assert "quantization" not in str(err.value)


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0)])
def test_gpus_with_fp8_pass(gpu: list[tuple[int, int]], capability: tuple[int, int]) -> None:
    gpu[0] = capability
    check_fp8_device(CUDA, "fp8", "fp8", "fp8")  # no error


def test_nothing_fp8_or_the_cpu_passes_on_any_gpu(gpu: list[tuple[int, int]]) -> None:
    check_fp8_device(CUDA, "none", None, "auto")
    check_fp8_device(torch.device("cpu"), "fp8", "fp8", "fp8")
