"""docs/results.md is generated from the checked-in result JSON (issue 30, item 5): the page in
the tree is what its data gives, and a claim that does not fit its data fails by name."""

from __future__ import annotations

import json

import pytest

from thinwire.bench import results_page


def test_the_results_page_is_what_its_data_gives():
    assert results_page.PAGE.read_text() == results_page.render(), \
        "docs/results.md is stale: run python -m thinwire.bench.results_page"


def _claim(**changes) -> dict:
    claim = {"title": "t", "issue": "0", "file": "r.json", "command": "thinwire bench x",
             "claim": "ratio {r:.2f}", "columns": ["algorithm", "ratio"],
             "figures": {"r": {"row": {"algorithm": "a"}, "key": "ratio"}}}
    claim.update(changes)
    return claim


@pytest.mark.parametrize("changes, rows, message", [
    ({}, [{"algorithm": "a", "ratio": 0.5}], None),
    ({"file": "missing.json"}, [], "does not exist"),
    ({}, [{"algorithm": "a", "ratio": 0.5}, {"algorithm": "a", "ratio": 0.6}],
     "must name exactly one row"),
    ({}, [{"algorithm": "a", "ratio": float("nan")}], "must be a finite number"),
    ({"columns": ["algorithm", "speed"]}, [{"algorithm": "a", "ratio": 1.0}],
     r"columns \['speed'\] missing"),
    ({"claim": "ratio {other}"}, [{"algorithm": "a", "ratio": 1.0}], "does not fit its figures"),
])
def test_a_claim_renders_from_its_rows_or_fails_by_name(tmp_path, changes, rows, message):
    if rows:
        (tmp_path / "r.json").write_text(json.dumps({"rows": rows}))
    claim = _claim(**changes)
    if message is None and rows:
        text = results_page.render_claim(claim, tmp_path)
        assert "ratio 0.50" in text and "thinwire bench x" in text and "sha256" in text
    elif message is not None:
        with pytest.raises(results_page.ClaimError, match=message):
            results_page.render_claim(claim, tmp_path)


def test_a_claim_reads_rows_from_a_dotted_path_and_names_a_missing_one(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(
        {"rows": [{"algorithm": "b", "ratio": 9.0}],
         "check": {"rows": [{"algorithm": "a", "ratio": 0.25}]}}))
    text = results_page.render_claim(_claim(rows="check.rows"), tmp_path)
    assert "ratio 0.25" in text
    with pytest.raises(results_page.ClaimError, match="no 'check.other' list"):
        results_page.render_claim(_claim(rows="check.other"), tmp_path)
