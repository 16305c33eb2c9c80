"""Result and summary tables: columns, values, highlighting, bad rows."""

from __future__ import annotations

import numpy as np
import pytest
from rich.console import Console
from rich.table import Table

from secfed.evaluation.metrics import RetrievalScores
from secfed.evaluation.report import DomainResult, results_table, summary_table

BOLD_GREEN = "\x1b[1;32m"


def render(table: Table, styles: bool = False) -> str:
    console = Console(record=True, width=200, force_terminal=True, color_system="standard")
    console.print(table)
    return console.export_text(styles=styles)


def scores(rank1: float, m_ap: float) -> RetrievalScores:
    cmc = np.full(50, 0.9)
    cmc[0] = rank1
    return RetrievalScores(rank1, 0.9, 0.9, m_ap, cmc, num_valid_queries=10, num_skipped_queries=0)


def test_full_rows_show_every_column_as_percentages() -> None:
    table = results_table(
        [
            DomainResult.from_scores(
                "market",
                scores(0.5123, 0.3),
                local=scores(0.4, 0.35),
                local_model={"rank1": 0.45, "mAP": 0.2},
                raw_pixels=scores(0.05, 0.01),
            ),
            {"domain": "duke", "rank1": 0.25, "mAP": 0.125, "local_rank1": 0.375, "local_mAP": 0.1},
        ]
    )
    headers = [" ".join(str(c.header).split()) for c in table.columns]
    assert headers == [
        "Domain", "Fed R-1", "Fed R-5", "Fed R-10", "Fed mAP",
        "Local R-1", "Local mAP", "Pre-agg R-1", "Pixels R-1",
    ]  # fmt: skip
    text = render(table)
    market = next(line for line in text.splitlines() if "market" in line)
    for value in ("51.2", "90.0", "30.0", "40.0", "35.0", "45.0", "5.0"):
        assert value in market
    duke = next(line for line in text.splitlines() if "duke" in line)
    assert "25.0" in duke and "12.5" in duke and "37.5" in duke and "–" in duke


def test_federated_cells_beating_local_only_are_marked_and_bold_green() -> None:
    table = results_table(
        [
            DomainResult("a", rank1=0.6, mAP=0.2, local_rank1=0.5, local_mAP=0.3),  # rank-1 beats, mAP not
            DomainResult("b", rank1=0.4, mAP=0.5, local_rank1=0.4, local_mAP=0.3),  # a tie is no win
        ]
    )
    styled = render(table, styles=True)
    assert f"{BOLD_GREEN}60.0*" in styled and f"{BOLD_GREEN}50.0*" in styled
    for plain in ("20.0", "40.0"):
        assert f"{BOLD_GREEN}{plain}" not in styled and f"{plain}*" not in styled
    plain_log = " ".join(render(table).split())  # what a log file gets: no colour, the mark and its meaning
    assert "60.0*" in plain_log and "*: federated beats local-only" in plain_log and "green" not in plain_log.lower()


def test_domain_names_are_text_not_markup() -> None:
    assert "cam[bold]1" in render(results_table([DomainResult("cam[bold]1", rank1=0.5)]))


def test_columns_nobody_measured_are_left_out() -> None:
    table = results_table([DomainResult("a", rank1=0.5, mAP=0.25), DomainResult("b", raw_pixels_rank1=0.1)])
    assert [" ".join(str(c.header).split()) for c in table.columns] == [
        "Domain", "Fed R-1", "Fed mAP", "Pixels R-1"
    ]
    assert "Fed:" in table.caption and "Pixels:" in table.caption and "Local:" not in table.caption
    assert "beats" not in table.caption  # nothing to compare with local-only training


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"domain": "a", "rank1": 1.5}, "a: rank1 must be a rate in"),
        ({"domain": "a", "rank_1": 0.5}, r"unknown keys \['rank_1'\]"),
        ({"rank1": 0.5}, "without a 'domain'"),
        ({"domain": "a", "federated": {"rank1": 0.5}, "rank1": 0.5}, r"unknown keys \['rank1'\]"),
        ({"domain": "a", "local": [0.5]}, "a: local scores must be RetrievalScores or a dict"),
        ({"domain": "", "rank1": 0.5}, "domain must be a non-empty string"),
    ],
)
def test_bad_rows_are_refused_with_the_reason(row: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        results_table([row])


def test_nested_dict_rows() -> None:
    row = DomainResult.from_dict(
        {"domain": "a", "federated": {"rank1": 0.5, "mAP": 0.25}, "local": {"rank1": 0.4}}
    )
    assert row == DomainResult("a", rank1=0.5, mAP=0.25, local_rank1=0.4)


def test_summary_table_computes_the_communication_cost() -> None:
    text = render(
        summary_table(
            {
                "rounds": 300,
                "wall_time_s": 3723.0,
                "shared_bytes": 45 * 2**20,
                "bytes_up": 1536,
                "epsilon": 2.51234,
            }
        )
    )
    cells = [line.split("│")[1:3] for line in text.splitlines() if line.count("│") == 3]
    lines = {label.strip(): value.strip() for label, value in cells}
    assert lines == {
        "Rounds": "300",
        "Wall time": "1 h 02 min",
        "Shared model size": "45.00 MiB",
        "Communication per client (MM'20: rounds × 2 × model)": "26.37 GiB",  # 300 × 2 × 45 MiB = 27,000 MiB
        "Bytes up, all clients (measured)": "1.50 KiB",
        "epsilon": "2.512",
    }


@pytest.mark.parametrize(("seconds", "text"), [(12.34, "12.3 s"), (125.4, "2 min 05 s"), (7200, "2 h 00 min")])
def test_wall_time_format(seconds: float, text: str) -> None:
    assert text in render(summary_table({"wall_time_s": seconds}))


@pytest.mark.parametrize(
    ("summary", "message"),
    [
        ({"bytes_down": -1}, "'bytes_down' must be a non-negative integer byte count"),
        ({"wall_time_s": float("nan")}, "'wall_time_s' must be a non-negative number"),
        ({"rounds": 2.5, "shared_bytes": 10}, "rounds must be a non-negative integer"),
    ],
)
def test_bad_summary_values_are_named(summary: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        summary_table(summary)


def test_tables_fit_80_columns_without_truncating_numbers() -> None:
    from rich.console import Console

    rows = [DomainResult(f"a-rather-long-domain-name-{i}", 0.343, 0.5, 0.6, 0.321, 0.164, 0.231, 0.5, 0.119)
            for i in range(3)]
    console = Console(width=80, record=True)
    console.print(results_table(rows))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for number in ("34.3", "50.0", "60.0", "32.1", "16.4", "23.1", "11.9"):
        assert number in text, number


def test_the_privacy_cell_carries_the_dfs_epsilon_and_ignores_a_damaged_one() -> None:
    """(found by review: `secfed compare` said "no client-level DP" alone for a DFH run whose summary
    states an identity-level DFS ε)"""
    from secfed.evaluation.report import privacy_cell
    from secfed.privacy.adversary import DFS_GUARANTEE

    dfs = {"guarantee": DFS_GUARANTEE, "released_models": 10.73, "delta": 1e-5}
    cell = privacy_cell({"mechanism": "none", "epsilon_against": [dfs, {**dfs, "released_models": "9"}, 3]})
    assert cell == "no client-level DP; DFS: identity-level ε = 10.7 (δ = 1e-05) vs whoever sees the DFS"
