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
