"""lib.bench.device on the CPU: slugs, resolution, properties and provenance."""

import pytest
import torch

from lib.bench import device


@pytest.mark.parametrize(
    "name, slug",
    [("NVIDIA H200", "nvidia-h200"), ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"), ("  A/B__c ", "a-b-c")],
)
def test_slug(name, slug):
    assert device.slug(name) == slug


def test_slug_rejects_empty():
    with pytest.raises(ValueError, match="no letters or digits"):
        device.slug("---")


def test_resolve():
    assert device.resolve("cpu") == "cpu"
    assert device.resolve("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="not one of"):
        device.resolve("gpu")


def test_cpu_properties_and_provenance():
    p = device.provenance("cpu")
    assert p["slug"] == "cpu" and p["kind"] == "cpu" and p["cores"] >= 1
    for key in ("torch", "numpy", "python", "date", "commit", "dirty"):
        assert key in p
    assert p["date"].endswith("Z") and len(p["date"]) == 20
    with pytest.raises(ValueError, match="takes 'cuda' or 'cpu'"):
        device.properties("auto")


def test_commit_falls_back_to_the_environment(monkeypatch):
    monkeypatch.setattr(device, "_git", lambda *a: None)
    monkeypatch.setenv("BOOK_COMMIT", "abc1234")
    assert device.commit() == {"commit": "abc1234", "dirty": None}


def test_book_commit_wins_over_the_copy_s_git(monkeypatch):
    monkeypatch.setattr(device, "_git", lambda *a: "f" * 40 if a[0] == "rev-parse" else " M lib/x.py")
    monkeypatch.setenv("BOOK_COMMIT", "abc1234")
    assert device.commit() == {"commit": "abc1234", "dirty": None}
    monkeypatch.delenv("BOOK_COMMIT")
    assert device.commit() == {"commit": "f" * 40, "dirty": True}


def test_clocks_without_a_gpu_is_none():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert device.clocks() is None
