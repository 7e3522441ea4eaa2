"""Cron schedules: the five standard fields (minute hour day-of-month month day-of-week) in
UTC, with `*`, lists, ranges and steps; parsed once, then asked for the next time after
another. As in cron, when both day fields are restricted (neither starts with `*`) a day
matches if either one does; day of week 0 and 7 are Sunday."""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# Each field's name (as errors say it) and its range.
FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
EXAMPLE = "'0 3 * * *' (03:00 UTC every day) or '*/15 * * * *'"


def _number(text: str, name: str, low: int, high: int) -> int:
    if not text.isdigit():
        raise ValueError(f"the {name} field: {text!r} is not a number from {low} to {high}")
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"the {name} field: {value} is outside {low}-{high}")
    return value


def _field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    """The values one field allows: items separated by commas, each `*`, `N` or `N-M`,
    optionally with a step `/S` (`N/S` runs from N to the field's end)."""
    values: set[int] = set()
    for item in text.split(","):
        body, slash, step_text = item.partition("/")
        step = _number(step_text, f"{name} step", 1, high - low + 1) if slash else 1
        if body == "*":
            first, last = low, high
        elif "-" in body:
            start, _, end = body.partition("-")
            first, last = _number(start, name, low, high), _number(end, name, low, high)
            if first > last:
                raise ValueError(f"the {name} field: the range {body} runs backwards")
        else:
            first = _number(body, name, low, high)
            last = high if slash else first
        values.update(range(first, last + 1, step))
    return frozenset(values)


@dataclass(frozen=True, repr=False)
class Schedule:
    """A parsed cron expression; `next_after` gives its times."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Monday ... 6 = Sunday (Python's numbering)
    any_day: bool             # the day-of-month field starts with `*`
    any_weekday: bool         # the day-of-week field starts with `*`

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """The schedule `text` says; ValueError naming the field and value that is wrong."""
        parts = text.split()
        if len(parts) != len(FIELDS):
            raise ValueError(f"{text!r} has {len(parts)} fields, cron needs 5 (minute hour day-of-month "
                             f"month day-of-week), e.g. {EXAMPLE}")
        try:
            minutes, hours, days, months, cron_weekdays = (
                _field(part, name, low, high) for part, (name, low, high) in zip(parts, FIELDS, strict=True)
            )
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc}; e.g. {EXAMPLE}") from None
        schedule = cls(text, minutes, hours, days, months,
                       frozenset((d - 1) % 7 for d in cron_weekdays),  # cron 0/7 = Sunday = Python 6
                       any_day=parts[2].startswith("*"), any_weekday=parts[4].startswith("*"))
        if not schedule.any_day and schedule.any_weekday and not any(
                day <= calendar.monthrange(2000, month)[1] for month in months for day in days):
            raise ValueError(f"{text!r} never happens: no month in it has day {min(days)}")
        return schedule

    def __repr__(self) -> str:
        return f"Schedule({self.text!r})"

    def _day_matches(self, t: datetime) -> bool:
        in_month, in_week = t.day in self.days, t.weekday() in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week

    def next_after(self, t: datetime) -> datetime:
        """The first time of the schedule strictly after `t` (an aware datetime), in UTC."""
        t = t.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        # At most a few thousand steps: a month, day or hour that does not match is skipped
        # whole, and parse() refused schedules no day of which exists (Feb 29 is within 8 years).
        while True:
            if t.month not in self.months:
                t = (t.replace(day=1, hour=0, minute=0) + timedelta(days=32)).replace(day=1)
            elif not self._day_matches(t):
                t = t.replace(hour=0, minute=0) + timedelta(days=1)
            elif t.hour not in self.hours:
                t = t.replace(minute=0) + timedelta(hours=1)
            elif t.minute not in self.minutes:
                t += timedelta(minutes=1)
            else:
                return t
