"""Cron schedules: parsing (errors name the field and value) and the next time after another."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from strata.operator.cron import Schedule


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def times(schedule: str, after: str, count: int) -> list[str]:
    s, t, out = Schedule.parse(schedule), at(after), []
    for _ in range(count):
        t = s.next_after(t)
        out.append(t.strftime("%Y-%m-%d %H:%M %a"))
    return out


def test_every_minute_is_the_next_whole_minute_strictly_after() -> None:
    assert times("* * * * *", "2026-12-06 07:00:00", 2) == ["2026-12-06 07:01 Sun", "2026-12-06 07:02 Sun"]
    assert times("* * * * *", "2026-12-06 07:00:59.9", 1) == ["2026-12-06 07:01 Sun"]


def test_steps_over_the_whole_range() -> None:
    assert times("*/15 * * * *", "2026-12-06 07:50:00", 3) == [
        "2026-12-06 08:00 Sun", "2026-12-06 08:15 Sun", "2026-12-06 08:30 Sun"]
    assert times("5/20 */6 * * *", "2026-12-06 23:50:00", 4) == [
        "2026-12-07 00:05 Mon", "2026-12-07 00:25 Mon", "2026-12-07 00:45 Mon", "2026-12-07 06:05 Mon"]


def test_weekdays_only_skip_the_weekend() -> None:
    assert times("0 3 * * 1-5", "2026-12-04 03:00:00", 2) == ["2026-12-07 03:00 Mon", "2026-12-08 03:00 Tue"]


def test_sunday_is_0_and_7() -> None:
    assert times("0 0 * * 0", "2026-12-01 00:00:00", 1) == times("0 0 * * 7", "2026-12-01 00:00:00", 1) == [
        "2026-12-06 00:00 Sun"]


def test_month_ends_skip_the_months_without_that_day() -> None:
    assert times("30 1 31 * *", "2026-01-31 02:00:00", 3) == [
        "2026-03-31 01:30 Tue", "2026-05-31 01:30 Sun", "2026-07-31 01:30 Fri"]
    assert times("0 0 29 2 *", "2026-03-01 00:00:00", 1) == ["2028-02-29 00:00 Tue"]


def test_year_end_rolls_over() -> None:
    assert times("0 0 1 1 *", "2026-12-31 23:59:00", 1) == ["2027-01-01 00:00 Fri"]


def test_lists_and_ranges_with_steps() -> None:
    assert times("0,30 9-17/4 * * *", "2026-12-07 08:00:00", 5) == [
        "2026-12-07 09:00 Mon", "2026-12-07 09:30 Mon", "2026-12-07 13:00 Mon", "2026-12-07 13:30 Mon",
        "2026-12-07 17:00 Mon"]


def test_both_day_fields_restricted_match_either() -> None:
    # The 13th of the month or any Friday (cron's rule).
    assert times("0 0 13 * 5", "2026-12-06 00:00:00", 3) == [
        "2026-12-11 00:00 Fri", "2026-12-13 00:00 Sun", "2026-12-18 00:00 Fri"]


def test_times_given_in_another_zone_are_read_as_utc() -> None:
    t = datetime(2026, 12, 6, 4, 0, tzinfo=timezone(timedelta(hours=2)))  # 02:00 UTC
    assert Schedule.parse("0 3 * * *").next_after(t) == at("2026-12-06 03:00:00")


@pytest.mark.parametrize(("text", "said"), [
    ("* * * *", "has 4 fields"),
    ("60 * * * *", "the minute field: 60 is outside 0-59"),
    ("* 24 * * *", "the hour field: 24 is outside 0-23"),
    ("* * 0 * *", "the day of month field: 0 is outside 1-31"),
    ("* * * 13 *", "the month field: 13 is outside 1-12"),
    ("* * * * 8", "the day of week field: 8 is outside 0-7"),
    ("*/0 * * * *", "the minute step field: 0 is outside 1-60"),
    ("5-1 * * * *", "the range 5-1 runs backwards"),
    ("a * * * *", "'a' is not a number"),
    ("1,,2 * * * *", "'' is not a number"),
    ("0 0 30 2 *", "never happens"),
])
def test_a_bad_schedule_is_refused_naming_the_field_and_value(text: str, said: str) -> None:
    with pytest.raises(ValueError, match="e.g.|never") as caught:
        Schedule.parse(text)
    assert said in str(caught.value)
