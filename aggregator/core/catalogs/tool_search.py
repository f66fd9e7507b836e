"""Ranking a catalog's tools against a query: an embedded BM25F index. Sans-IO.

What is indexed, per tool, in fields of different weight: its exposed name (split on
``_``, ``-``, ``.``, ``/`` and case changes: ``git__git_diff_staged`` and ``getCurrentTime``
give ``git diff staged`` and ``get current time``), its title, its description, the names
and descriptions of its parameters, and its server's name and instructions. Words are
lower-cased and cut to a crude stem (``entities`` and ``entity``, ``created`` and
``create`` meet). A query's words reach, at a lower weight, the common synonyms of
everyday software verbs and nouns (``remove`` finds ``delete``, ``folder`` finds
``directory``) and, when the word itself is not indexed, the longer indexed words it
begins (``reposit`` finds ``repository``).

Scoring is BM25F (Robertson and Zaragoza): each field's word counts are normalised by
that field's length against its average, weighted, summed and saturated; a word that
many tools share counts for little, one that few have counts for much, and a long
description does not win by length alone. Ties keep
the catalog's order, so results are deterministic.

The index is built from exactly the tools a caller may see (policy and plugins have
already removed the rest): a hidden tool never appears and never changes a score. It is
rebuilt whenever that catalog changes (``SearchIndexes``).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterator
from typing import Any

K1 = 1.2
B = 0.75
# Field weights: a word in the name says more about a tool than one in its description.
NAME, TITLE, DESCRIPTION, PARAMETERS, SERVER = 3.0, 2.0, 1.0, 0.6, 0.4
SYNONYM_WEIGHT = 0.5  # a synonym of a query word counts this much of the word
PREFIX_WEIGHT = 0.4  # an indexed word that a query word not indexed begins (at least 4 letters)
MAX_PREFIX_EXPANSIONS = 8
MAX_QUERY_WORDS = 32
MAX_TEXT = 4096  # characters of one field taken from one tool (descriptions can be huge)

_PIECES = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_SPLIT = re.compile(r"[^A-Za-z0-9]+")
_STOP = frozenset(
    "a an and are as at be by can could do does for from has have how i in into is it its me my of on "
    "or our please some that the their them then there these this those to us was we what when where "
    "which who will with would you your".split()
)
# Everyday words of software tasks that mean the same thing: a query word reaches the others.
_SYNONYM_GROUPS = (
    "create make new add insert generate",
    "delete remove erase drop destroy discard purge forget wipe",
    "read open view show display get retrieve load see print cat inspect examine",
    "write save store persist put record",
    "edit modify change update alter replace patch",
    "list enumerate browse ls index",
    "search find query lookup look locate grep seek match filter mention contain",
    "move rename relocate mv",
    "directory folder dir",
    "file document",
    "content contents text body",
    "time clock hour date now",
    "timezone zone tz",
    "convert translate transform",
    "url web webpage page website http link internet download",
    "log history timeline past",
    "commit revision changeset",
    "diff difference compare",
    "undo reset revert unstage discard",
    "remember memorize memory note",
    "entity node",
    "relation relationship connection link associate connect relate",
    "observation fact",
    "think reason reflect plan thought step",
    "sum total plus calculate arithmetic add",
    "echo repeat",
    "image picture photo screenshot png jpg jpeg gif",
    "media audio sound video",
    "environment env variable",
    "tree hierarchy structure recursive",
    "size bytes space disk storage usage large big",
    "metadata info information detail stat",
    "permission permitted allow allowed access accessible authorized",
    "config configuration setting preference",
    "error fail failure",
)


def stem(word: str) -> str:
    """A crude suffix stripper (plural, -ed, -ing, a final e): enough to make the common
    forms of one English word meet; never shorter than three letters."""
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith("sses"):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    if word.endswith("ing") and len(word) > 5:
        word = word[:-3]
    elif word.endswith("ed") and len(word) > 4:
        word = word[:-2]
    if word.endswith("e") and len(word) > 4:
        word = word[:-1]
    return word


def words(text: str) -> Iterator[str]:
    """The indexed words of ``text``, in order: split, lower-cased, stop words dropped, stemmed."""
    for chunk in _SPLIT.split(text[:MAX_TEXT]):
        for piece in _PIECES.findall(chunk):
            lowered = piece.lower()
            if lowered not in _STOP:
                yield stem(lowered)


_SEEN: dict[str, list[str]] = {}  # text -> its words: a rebuild re-reads only what changed
_SEEN_MAX = 65536


def words_of(text: str) -> list[str]:
    """``words(text)``, remembered (bounded): most of a catalog is the same after a change."""
    found = _SEEN.get(text)
    if found is None:
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.clear()
        found = _SEEN[text] = list(words(text))
    return found


def _synonyms() -> dict[str, tuple[str, ...]]:
    table: dict[str, set[str]] = {}
    for group in _SYNONYM_GROUPS:
        stems = {stem(w) for w in group.split()}
        for one in stems:
            table.setdefault(one, set()).update(stems - {one})
    return {word: tuple(sorted(others)) for word, others in table.items()}


SYNONYMS = _synonyms()


def _text(value: Any) -> str:
    return value if type(value) is str else ""


def _parameter_text(schema: Any) -> str:
    """The names and descriptions of a tool's parameters (the top level of its input schema)."""
    properties = schema.get("properties") if type(schema) is dict else None
    if type(properties) is not dict:
        return ""
    parts = []
    for name, spec in list(properties.items())[:64]:
        parts.append(str(name))
        if type(spec) is dict:
            parts.append(_text(spec.get("description"))[:512])
    return " ".join(parts)


class ToolIndex:
    """An inverted index over one list of tools (as exposed), with the server of each."""

    def __init__(self, tools: list[dict[str, Any]], servers: list[str], about: dict[str, str]) -> None:
        """``servers[i]`` owns ``tools[i]``; ``about`` has each server's name and instructions."""
        self.tools = tools
        server_words = {name: list(words(f"{name} {text}")) for name, text in about.items()}
        weights = (NAME, TITLE, DESCRIPTION, PARAMETERS, SERVER)
        fields: list[list[list[str]]] = []  # per tool, per field: its words
        for index, tool in enumerate(tools):
            annotations = tool.get("annotations")
            title = _text(tool.get("title")) or (_text(annotations.get("title")) if type(annotations) is dict else "")
            fields.append(
                [
                    words_of(_text(tool.get("name"))),
                    words_of(title),
                    words_of(_text(tool.get("description"))),
                    words_of(_parameter_text(tool.get("inputSchema"))),
                    server_words.get(servers[index], []),
                ]
            )
        count = max(len(tools), 1)
        averages = [max(sum(len(f[i]) for f in fields) / count, 1.0) for i in range(len(weights))]
        # BM25F: each field's counts normalised by its own length against that field's average
        # (a server's long instructions do not make its tools' names count for less), then
        # weighted and summed into one count per word and tool, saturated at query time.
        postings: dict[str, dict[int, float]] = {}
        for index, tool_fields in enumerate(fields):
            counts: dict[str, float] = {}
            for weight, average, field in zip(weights, averages, tool_fields, strict=True):
                if not field:
                    continue
                share = weight / (1.0 - B + B * len(field) / average)
                for word in field:
                    counts[word] = counts.get(word, 0.0) + share
            for word, value in counts.items():
                postings.setdefault(word, {})[index] = value
        self.postings = postings
        self.vocabulary = sorted(postings)
        total = len(tools)
        self.idf = {w: math.log(1.0 + (total - len(p) + 0.5) / (len(p) + 0.5)) for w, p in postings.items()}

    def query_terms(self, query: str) -> dict[str, float]:
        """Each indexed word the query reaches, with how much a match of it is worth (its
        idf, times its weight). A synonym or a longer word reached from a query word is
        never worth more than that word itself when it is indexed: a rare synonym must
        not outweigh what was asked."""
        terms: dict[str, float] = {}
        asked = list(dict.fromkeys(words(query)))[:MAX_QUERY_WORDS]
        for word in asked:
            if word in self.idf:
                terms[word] = self.idf[word]
        for word in asked:
            cap = self.idf.get(word, math.inf)
            reached = [(other, SYNONYM_WEIGHT) for other in SYNONYMS.get(word, ())]
            if len(word) >= 4 and word not in self.postings:  # a word cut short: the longer ones
                start = bisect.bisect_left(self.vocabulary, word)
                for longer in self.vocabulary[start : start + MAX_PREFIX_EXPANSIONS + 1]:
                    if not longer.startswith(word):
                        break
                    reached.append((longer, PREFIX_WEIGHT))
            for other, weight in reached:
                if other in self.idf:
                    worth = weight * min(self.idf[other], cap)
                    if terms.get(other, 0.0) < worth:
                        terms[other] = worth
        return terms

    def search(self, query: str, limit: int) -> list[int]:
        """The indexes of the best ``limit`` tools for ``query``, best first; only tools that
        match at least one of its words."""
        scores: dict[int, float] = {}
        for word, worth in self.query_terms(query).items():
            idf = worth * (K1 + 1.0)
            for index, count in self.postings[word].items():
                scores[index] = scores.get(index, 0.0) + idf * count / (count + K1)
        ranked = sorted(scores, key=lambda i: (-scores[i], i))
        return ranked[:limit]
