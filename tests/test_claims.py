"""lib.bench.claims: checks, the table, strict and lenient reports."""

import math

import pytest

from lib.bench.claims import Claims, ClaimsFailed


def test_check_records_the_verdict_and_returns_nothing():
    c = Claims(strict=True)
    assert c.check("ratio at least half", 0.6, at_least=0.5) is None  # a cell ending in a check shows nothing
    c.check("ratio at most half", 0.6, at_most=0.5)
    c.check("inside a band", 1.0, at_least=0.9, at_most=1.1)
    c.check("nan never holds", math.nan, at_least=0.0)
    assert [x.holds for x in c.items] == [True, False, True, False]
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
    assert list(pasted["claims_table"].frame["holds"]) == ["yes", "NO", "NO"]
    assert list(pasted["claims_table"].frame["claim"]) == ["a", "b", "c"]  # the claim is a column, not the index
    assert pasted["book_targets"] == "[]" and "book_targets_table" not in pasted


def test_a_target_is_reported_never_raised(monkeypatch):
    import json

    from lib.bench import glue

    pasted = {}
    monkeypatch.setattr(glue, "_paste", lambda name, value: pasted.__setitem__(name, value))
    c = Claims(strict=True)
    c.check("a claim", 1.0, at_least=0.5)
    assert c.target("met goal", 1.0, at_least=0.97) is True
    assert c.target("missed goal", 0.81, at_least=0.97) is False
    assert c.target("no value", float("nan"), at_most=1.0) is False
    c.report()  # strict, yet a missed target does not raise: it is not a claim
    assert [x.text for x in c.failed] == []
    c.glue()
    goals = json.loads(pasted["book_targets"])
    assert goals == [{"target": "met goal", "value": 1.0, "goal": ">= 0.97", "met": True},
                     {"target": "missed goal", "value": 0.81, "goal": ">= 0.97", "met": False},
                     {"target": "no value", "value": None, "goal": "<= 1", "met": False}]
    assert list(pasted["book_targets_table"].frame["met"]) == ["yes", "no", "no"]
    with pytest.raises(ValueError, match="no bound"):
        c.target("unbounded", 1.0)
    with pytest.raises(ValueError, match="unique"):
        c.target("met goal", 2.0, at_least=0)
    with pytest.raises(TypeError, match="must be a number"):
        c.target("words", "fast", at_least=0)


def test_a_claim_exactly_at_its_bound_holds():
    c = Claims(strict=True)
    c.check("at the floor", 0.85, at_least=0.85)
    c.check("at the ceiling", 1.3, at_most=1.3)
    c.check("just under the floor", math.nextafter(0.85, 0), at_least=0.85)
    c.check("just over the ceiling", math.nextafter(1.3, 2), at_most=1.3)
    c.check("an integer bound", 2, at_least=2, at_most=2)
    assert [x.holds for x in c.items] == [True, True, False, False, True]
    assert [x.text for x in c.failed] == ["just under the floor", "just over the ceiling"]


def test_infinities_never_hold():
    c = Claims(strict=False)
    c.check("inf above a floor", math.inf, at_least=0.0)
    c.check("-inf under a ceiling", -math.inf, at_most=0.0)
    assert [x.holds for x in c.items] == [False, False] and len(c.failed) == 2


def test_the_table_shows_values_and_bounds_to_four_figures():
    c = Claims(strict=False)
    c.check("a big rate", 1234567.0, at_least=1e6)
    c.check("a ratio", 0.123456, at_most=0.5)
    c.check("a band", 1.0, at_least=0.95, at_most=1.05)
    f = c.frame()
    assert f.index.name == "claim" and list(f.index) == ["a big rate", "a ratio", "a band"]
    assert list(f["value"]) == [1234567.0, 0.123456, 1.0]  # numbers: the glued table prints them
    from lib.bench.glue import Table

    assert Table(f).frame["value"].tolist() == ["1234567", "0.1235", "1"]
    assert list(f["bound"]) == [">= 1000000", "<= 0.5", ">= 0.95 and <= 1.05"]
    assert list(f["holds"]) == ["yes", "yes", "yes"]


def test_strict_report_lists_the_failures_in_order():
    c = Claims(strict=1)  # any truthy value
    c.check("fails one", 0.1, at_least=1.0)
    c.check("holds", 2.0, at_least=1.0)
    c.check("fails two", 5.0, at_most=1.0)
    with pytest.raises(ClaimsFailed) as e:
        c.report()
    assert str(e.value) == ("2 of 3 claims do not hold on the reference set: "
                            "fails one: 0.1, expected >= 1; fails two: 5, expected <= 1")
    assert isinstance(e.value, AssertionError)


def test_lenient_report_says_why_it_only_warns(capsys):
    c = Claims(strict=0)
    c.check("fails one", 0.1, at_least=1.0)
    c.check("fails two", 5.0, at_most=1.0)
    c.check("holds", 1.0, at_most=1.0)
    c.report()  # does not raise
    err = capsys.readouterr().err
    assert err == ("WARNING: 2 of 3 claims do not hold on this data: fails one: 0.1, expected >= 1; "
                   "fails two: 5, expected <= 1. Other hardware or a smoke-sized run may legitimately differ "
                   "from the reference set.\n")


def test_report_outside_a_notebook_prints_the_table(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "IPython.display", None)  # importing it now raises ImportError
    c = Claims(strict=True)
    c.check("holds", 1.0, at_least=0.5)
    c.report()
    out = capsys.readouterr().out
    assert "holds" in out and "1" in out and ">= 0.5" in out and "yes" in out


def test_bad_claims_are_rejected_with_reasons():
    c = Claims(strict=True)
    with pytest.raises(ValueError, match="^claim 'unbounded' has no bound: give at_least=, at_most= or both$"):
        c.check("unbounded", 1.0)
    with pytest.raises(ValueError, match="^claim text must be non-empty and unique; '' is empty or already used$"):
        c.check("", 1.0, at_least=0.0)
    with pytest.raises(TypeError, match=r"^claim 'none': value must be a number, got None$"):
        c.check("none", None, at_least=0.0)
    with pytest.raises(ValueError, match="^no claims were checked: a chapter states its claims with check"):
        c.report()
    assert c.items == [] and c.failed == []  # a refused claim is not recorded


def test_a_targets_table_is_recorded_row_by_row():
    import pandas as pd

    c = Claims(strict=True)
    c.targets_from(pd.DataFrame({"target": ["fast", "small", "in band"], "measured": [0.95, 1.2, 0.33],
                                 "goal": [">= 0.9", "<= 1.15", "0.15 to 0.30"]}))
    assert [(g.text, g.at_least, g.at_most, g.holds) for g in c.targets] == [
        ("fast", 0.9, None, True), ("small", None, 1.15, False), ("in band", 0.15, 0.30, False)]
    with pytest.raises(ValueError, match="is not '>= x'"):
        c.targets_from(pd.DataFrame({"target": ["odd"], "measured": [1.0], "goal": ["about 1"]}))
