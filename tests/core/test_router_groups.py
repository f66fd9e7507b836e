"""The router's handler groups never define the same method twice: one would silently win."""

from __future__ import annotations

from collections import defaultdict

from aggregator.core.router import Router
from aggregator.core.state import RouterState


def test_no_two_handler_groups_define_the_same_method():
    groups = [cls for cls in Router.__mro__[1:] if cls is not RouterState and issubclass(cls, RouterState)]
    assert len(groups) >= 2  # the groups that remain are there to check
    owners = defaultdict(list)
    for group in groups:
        for name, value in vars(group).items():
            if callable(value) and not name.startswith("__"):
                owners[name].append(group.__name__)
    clashes = {name: where for name, where in owners.items() if len(where) > 1}
    assert not clashes, clashes
