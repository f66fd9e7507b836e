"""Task ids, mapped reversibly between upstreams and clients, and who may name them.

A client sees ``<server>/<upstream task id>``: server keys never contain "/", so the
first "/" splits it back without a table. Every place a task id appears in a message is
rewritten: ``task.taskId`` in a created-task result, ``taskId`` in tasks/get and
tasks/cancel results and status notifications, ``tasks[].taskId`` in tasks/list, and the
related-task entry in ``_meta``.

Two eras of tasks. A 2025-11-25 task (``capabilities.tasks``) belongs to the session that
created it (the router's ``tasks``). A 2026-07-28 task (the ``io.modelcontextprotocol/tasks``
extension: a ``tools/call`` answered with ``resultType: "task"``, then ``tasks/get``,
``tasks/update``, ``tasks/cancel``) is created by a modern caller, who has no session: it
belongs to the caller's principal (``TaskOwners``), so any request of that principal may
poll it and no other's may.
"""

from __future__ import annotations

from typing import Any

RELATED_TASK = "io.modelcontextprotocol/related-task"
# The modern tasks remembered at most: past it the oldest is forgotten (unknown from then on).
MAX_MODERN_TASKS = 10_000


class TaskOwners:
    """Exposed modern task id -> the principal whose request created it, the oldest
    forgotten past ``limit`` (tasks expire upstream; this map must not grow without end)."""

    __slots__ = ("_owners", "limit")

    def __init__(self, limit: int = MAX_MODERN_TASKS) -> None:
        self._owners: dict[str, Any] = {}
        self.limit = limit

    def add(self, task_id: str, principal: Any) -> None:
        self._owners.pop(task_id, None)
        self._owners[task_id] = principal
        if len(self._owners) > self.limit:
            del self._owners[next(iter(self._owners))]

    def owned_by(self, task_id: Any, principal: Any) -> bool:
        return type(task_id) is str and task_id in self._owners and self._owners[task_id] == principal

    def __len__(self) -> int:
        return len(self._owners)


def expose_task_id(server: str, task_id: Any) -> Any:
    return f"{server}/{task_id}" if type(task_id) is str else task_id


def split_task_id(exposed: Any) -> tuple[str, str] | None:
    if type(exposed) is not str or "/" not in exposed:
        return None
    server, _, task_id = exposed.partition("/")
    return server, task_id


def expose_task_ids(server: str, value: Any) -> list[str]:
    """Rewrite task ids in a result or params object in place; return the exposed ids."""
    if type(value) is not dict:
        return []
    exposed = []
    if "taskId" in value and type(value["taskId"]) is str:
        value["taskId"] = expose_task_id(server, value["taskId"])
        exposed.append(value["taskId"])
    task = value.get("task")
    if type(task) is dict and type(task.get("taskId")) is str:
        task["taskId"] = expose_task_id(server, task["taskId"])
        exposed.append(task["taskId"])
    tasks = value.get("tasks")
    if type(tasks) is list:
        for item in tasks:
            if type(item) is dict and type(item.get("taskId")) is str:
                item["taskId"] = expose_task_id(server, item["taskId"])
                exposed.append(item["taskId"])
    meta = value.get("_meta")
    related = meta.get(RELATED_TASK) if type(meta) is dict else None
    if type(related) is dict and type(related.get("taskId")) is str:
        related["taskId"] = expose_task_id(server, related["taskId"])
    return exposed


def restore_related_task(params: Any, server: str) -> None:
    """Turn an exposed related-task id in a client's ``_meta`` back into the upstream's."""
    meta = params.get("_meta") if type(params) is dict else None
    related = meta.get(RELATED_TASK) if type(meta) is dict else None
    if type(related) is dict:
        split = split_task_id(related.get("taskId"))
        if split is not None and split[0] == server:
            related["taskId"] = split[1]
