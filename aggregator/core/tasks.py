"""Task ids (MCP 2025-11-25 tasks), mapped reversibly between upstreams and clients.

A client sees ``<server>/<upstream task id>``: server keys never contain "/", so the
first "/" splits it back without a table. Every place a task id appears in a message is
rewritten: ``task.taskId`` in a created-task result, ``taskId`` in tasks/get and
tasks/cancel results and status notifications, ``tasks[].taskId`` in tasks/list, and the
related-task entry in ``_meta``.
"""

from __future__ import annotations

from typing import Any

RELATED_TASK = "io.modelcontextprotocol/related-task"


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
