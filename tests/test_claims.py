"""lib.bench.claims: checks, the table, strict and lenient reports."""

import math

import pytest

from lib.bench.claims import Claims, ClaimsFailed


def test_check_records_and_returns_the_verdict():
    c = Claims(strict=True)
    assert c.check("ratio at least half", 0.6, at_least=0.5)
    assert not c.check("ratio at most half", 0.6, at_most=0.5)
    assert c.check("inside a band", 1.0, at_least=0.9, at_most=1.1)
    assert not c.check("nan never holds", math.nan, at_least=0.0)
    assert [x.text for x in c.failed] == ["ratio at most half", "nan never holds"]
    f = c.frame()
    assert list(f.columns) == ["value", "bound", "holds"]
    assert list(f["holds"]) == ["yes", "NO", "yes", "NO"]
    assert f.loc["inside a band", "bound"] == ">= 0.9 and <= 1.1"


def test_strict_report_raises_with_every_failure(capsys):
    c = Claims(strict=True)
    c.check("holds", 2.0, at_least=1.0)
    c.check("fails one", 0.1, at_least=1.0)
    c.check("fails two", 5.0, at_most=1.0)
    with pytest.raises(ClaimsFailed) as e:
        c.report()
    msg = str(e.value)
    assert "2 of 3 claims" in msg and "fails one: 0.1, expected >= 1" in msg and "fails two" in msg
    assert "holds" in capsys.readouterr().out  # the table is shown before the error


def test_lenient_report_warns_visibly(capsys):
    c = Claims(strict=False)
    c.check("fails", 0.1, at_least=1.0)
    c.report()
    err = capsys.readouterr().err
    assert err.startswith("WARNING: 1 of 1 claims do not hold") and "fails: 0.1" in err


def test_passing_report_is_quiet(capsys):
    c = Claims(strict=True)
    c.check("holds", 1.0, at_least=1.0, at_most=1.0)
    c.report()
    assert capsys.readouterr().err == ""


def test_bad_claims_are_rejected():
    c = Claims(strict=True)
    with pytest.raises(ValueError, match="no bound"):
        c.check("unbounded", 1.0)
    c.check("once", 1.0, at_least=0.0)
    with pytest.raises(ValueError, match="unique"):
        c.check("once", 1.0, at_least=0.0)
    with pytest.raises(TypeError, match="must be a number"):
        c.check("text value", "fast", at_least=0.0)
    with pytest.raises(ValueError, match="no claims"):
        Claims(strict=False).report()


def test_glue_pastes_the_table_and_the_counts(monkeypatch):
    from lib.bench import glue

    pasted = {}
    monkeypatch.setattr(glue, "_paste", lambda name, value: pasted.__setitem__(name, value))
    c = Claims(strict=False)
    c.check("a", 1.0, at_least=0)
    c.check("b", 1.0, at_most=0)
    c.check("c", float("nan"), at_most=0)
    c.glue()
    assert pasted["claims_held"] == 1.0 and pasted["claims_total"] == 3.0
    assert list(pasted["claims_table"]["holds"]) == ["yes", "NO", "NO"]
