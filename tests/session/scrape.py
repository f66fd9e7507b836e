"""A hub's metrics read back through the exposition parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(hub) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, content_type = hub.metrics.exposition()
    assert content_type.startswith("text/plain")
    found = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def only(found, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (sample, labels), value in found.items() if sample == name}
