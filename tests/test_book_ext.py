"""tools/site/book_ext.py: the pinned MathJax copy, and the numbers of the generated pages."""

import base64
import hashlib
import io
import tarfile

import pytest

from tools.site import book_ext


def fake_release(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_mathjax_is_checked_unpacked_and_kept(tmp_path, monkeypatch):
    data = fake_release({"package/es5/tex-mml-chtml.js": b"mj", "package/es5/input/tex/extensions/ams.js": b"ams",
                         "package/es5/output/chtml/fonts/woff-v2/a.woff": b"font", "package/es5/tex-svg.js": b"svg",
                         "package/README.md": b"readme"})
    monkeypatch.setattr(book_ext, "MATHJAX_SHA512", base64.b64encode(hashlib.sha512(data).digest()).decode())
    calls = []
    out = book_ext.mathjax_static(tmp_path, fetch=lambda url: calls.append(url) or data)
    got = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert got == ["mathjax/input/tex/extensions/ams.js", "mathjax/output/chtml/fonts/woff-v2/a.woff",
                   "mathjax/tex-mml-chtml.js"]
    assert calls == [book_ext.MATHJAX_URL]
    assert book_ext.mathjax_static(tmp_path, fetch=lambda url: pytest.fail("fetched twice")) == out


def test_mathjax_with_the_wrong_digest_is_refused(tmp_path):
    with pytest.raises(book_ext.MathJaxError, match="sha512"):
        book_ext.mathjax_static(tmp_path, fetch=lambda url: fake_release({"package/es5/tex-mml-chtml.js": b"x"}))
    assert not (tmp_path / f"mathjax-{book_ext.MATHJAX_VERSION}").exists()


def test_mathjax_offline_says_where_to_put_the_file(tmp_path):
    def offline(url):
        raise OSError("network is unreachable")

    with pytest.raises(book_ext.MathJaxError, match=f"mathjax-{book_ext.MATHJAX_VERSION}.tgz"):
        book_ext.mathjax_static(tmp_path, fetch=offline)


def test_fmt():
    assert [book_ext.fmt(v) for v in (4243.84, 187.2, 12.34, 1.046, 0.02301, None, float("nan"))] == [
        "4,244", "187", "12.3", "1.05", "0.023", "-", "-"]


def test_status_tables_from_hand_made_rows():
    """The status page: a summary line, one row per chapter with its claims held and targets met, and every
    target with its value, goal, met or missed and the date of the measurement it comes from."""
    rows = [
        {"chapter": "00-a", "results": True, "fresh": True, "stale": [], "device": "GPU X", "date": "2026-12-01",
         "commit": "abc1234", "torch": "2.9", "triton": "3.5", "cuda": "12.8", "driver": "570",
         "claims_held": 3.0, "claims_total": 3.0,
         "targets": [{"target": "fast", "value": 1.234, "goal": ">= 1", "met": True},
                     {"target": "faster", "value": 0.8, "goal": ">= 0.9", "met": False}]},
        {"chapter": "01-b", "results": True, "fresh": False, "stale": ["code changed"], "device": "GPU X",
         "date": "2026-11-30", "commit": "def5678+", "torch": "2.9", "triton": "3.5", "cuda": "12.8",
         "driver": "570", "claims_held": 2.0, "claims_total": 2.0,
         "targets": [{"target": "small", "value": 4.0, "goal": "<= 5", "met": True}]},
        {"chapter": "02-c", "results": False, "claims_held": None, "claims_total": None, "targets": []},
    ]
    summary, (head, body), (thead, tbody), stale = book_ext.status_tables(rows)
    assert summary == ("1 of 3 chapters have fresh reference results; 5 of 5 claims hold. The chapters set 3 "
                       "targets for the book's own code: 2 met, 1 missed (in 00-a).")
    assert head[-2:] == ["claims hold", "targets met"]
    assert body == [
        ["00-a", "GPU X, 2026-12-01, commit abc1234", "torch 2.9, Triton 3.5, CUDA 12.8, driver 570", "yes",
         "3 of 3", "1 of 2 (1 missed)"],
        ["01-b", "GPU X, 2026-11-30, commit def5678+", "torch 2.9, Triton 3.5, CUDA 12.8, driver 570", "no (below)",
         "2 of 2", "1 of 1"],
        ["02-c", "no results", "-", "-", "-", "-"],
    ]
    assert stale == ["01-b: code changed"]
    assert thead == ["chapter", "target", "value", "goal", "met", "measured"]
    assert tbody == [["00-a", "fast", "1.23", ">= 1", "met", "2026-12-01"],
                     ["00-a", "faster", "0.8", ">= 0.9", "MISSED", "2026-12-01"],
                     ["01-b", "small", "4.00", "<= 5", "met", "2026-11-30"]]


def test_status_tables_without_targets_has_no_targets_table():
    rows = [{"chapter": "00-a", "results": False, "claims_held": 1.0, "claims_total": 1.0, "targets": []}]
    summary, _, targets, stale = book_ext.status_tables(rows)
    assert stale == []
    assert targets is None and summary.endswith("The chapters set 0 targets for the book's own code: 0 met, 0 missed.")
