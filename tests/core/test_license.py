"""The licence pyproject.toml declares is the one the repository ships, in full."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_the_declared_mit_license_is_shipped() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert declared == {"text": "MIT"}
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n\nCopyright (c) 2026 The aggregator authors\n")
    assert "Permission is hereby granted, free of charge, to any person obtaining a copy" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text
