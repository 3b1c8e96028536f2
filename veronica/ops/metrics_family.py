"""The Prometheus text-format toolkit /metrics is built from: a family of series, the grouped-count and
histogram queries. Moved out of veronica.ops.metrics so metrics and metrics_members both build on it without
importing each other."""
from __future__ import annotations

from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, QuerySet, Sum

from veronica.models import Run


def _esc(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: object) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items()) + "}" if labels else ""


class Family:
    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name, self.kind, self.help = name, kind, help_text
        self.lines: list[str] = []

    def add(self, value: float | int, suffix: str = "", **labels: object) -> None:
        number = int(value) if isinstance(value, int) or float(value).is_integer() else float(value)
        self.lines.append(f"{self.name}{suffix}{_labels(**labels)} {number}")

    def render(self) -> str:
        return "\n".join([f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}", *self.lines])


def _counts(qs: QuerySet, *fields: str) -> list[dict]:
    return list(qs.values(*fields).annotate(n=Count("id")).order_by(*fields))


def _histogram(qs: QuerySet, field: str, buckets: tuple, to_le, by: tuple[str, ...] = ("member__space_id",)) -> QuerySet:
    """Cumulative bucket counts per space (or per `by`) in one grouped query."""
    aggs = {f"le_{i}": Count("id", filter=Q(**{f"{field}__lte": to_le(b)})) for i, b in enumerate(buckets)}
    return qs.values(*by).annotate(total=Count("id"), total_sum=Sum(field), **aggs).order_by(*by)


def add_histogram(fam: Family, row: dict, buckets: tuple, total_sum: float | int, **labels: object) -> None:
    """One histogram's series from a _histogram row: the buckets, +Inf, _sum and _count."""
    for i, b in enumerate(buckets):
        fam.add(row[f"le_{i}"], "_bucket", **labels, le=b)
    fam.add(row["total"], "_bucket", **labels, le="+Inf")
    fam.add(total_sum, "_sum", **labels)
    fam.add(row["total"], "_count", **labels)


def run_durations(ids: list[int]) -> QuerySet:
    return Run.objects.filter(member__space_id__in=ids, ended_at__isnull=False).annotate(
        duration=ExpressionWrapper(F("ended_at") - F("started_at"), output_field=DurationField()))
