"""What the proxy accepts as an upstream's initialize result: lenient where harmless,
strict where it would stumble later, and always naming the field."""

import pytest

from aggregator.mcp.initialize import initialize_result_problem

GOOD = {
    "protocolVersion": "2025-06-18",
    "capabilities": {"tools": {"listChanged": True}},
    "serverInfo": {"name": "s", "version": "1"},
}


@pytest.mark.parametrize(
    "result",
    [
        GOOD,
        {**GOOD, "x-vendor": {"anything": [1, 2]}, "instructions": 42},  # extra fields; odd instructions ignored
        {"protocolVersion": "2024-11-05", "capabilities": {}},  # no serverInfo: it is only logged
        {**GOOD, "capabilities": {"experimental": "whatever", "future-thing": True, "tools": {}}},
        {**GOOD, "serverInfo": {"name": 5}},  # its contents are only logged
        {**GOOD, "serverInfo": None},
    ],
)
def test_accepted(result):
    assert initialize_result_problem(dict(result)) is None


def test_null_capabilities_mean_absent():
    result = {**GOOD, "capabilities": {"tools": None, "logging": {}}}
    assert initialize_result_problem(result) is None
    assert result["capabilities"] == {"logging": {}}


@pytest.mark.parametrize(
    ("result", "problem"),
    [
        ({"capabilities": {}}, "protocolVersion is missing"),
        ({**GOOD, "protocolVersion": "1999-01-01"}, "protocolVersion '1999-01-01' is not one the aggregator speaks"),
        ({**GOOD, "protocolVersion": 20250618}, "protocolVersion 20250618 is not one"),
        ({"protocolVersion": "2025-06-18"}, "capabilities is missing"),
        ({**GOOD, "capabilities": ["tools"]}, "capabilities must be an object, not an array"),
        ({**GOOD, "capabilities": "all"}, "capabilities must be an object, not a string ('all')"),
        ({**GOOD, "capabilities": {"resources": True}}, "capabilities.resources must be an object, not a boolean"),
        ({**GOOD, "capabilities": {"tasks": 5}}, "capabilities.tasks must be an object, not a number"),
        ({**GOOD, "serverInfo": "server 1.0"}, "serverInfo must be an object, not a string ('server 1.0')"),
        ({**GOOD, "serverInfo": 7}, "serverInfo must be an object, not a number"),
    ],
)
def test_refused_with_the_field_named(result, problem):
    assert initialize_result_problem(dict(result)).startswith(problem)
