"""The API conventions of docs/development.md ("API conventions"), checked over every public
signature: one idea has one spelling, so a user learns it once. A new exception fails here
naming ``module.Class.method(param)``; a real exception goes in ALLOWED with the reason the
doc gives."""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re
import typing
from typing import Any, Callable, Iterator

import pytest

MODULES = ["fastloop", "fastloop.data", "fastloop.monitor", "fastloop.checkpoint", "fastloop.serve",
           "fastloop.nn", "fastloop.cuda", "fastloop.ops", "fastloop.images"]

# Real exceptions, each one the doc names. Keys are "module.Qualname(param)" or, for a rule
# about the whole signature, "module.Qualname".
ALLOWED: dict[str, str] = {
    # "Queue.close(immediate=False) follows queue.Queue.shutdown instead" (Closing)
    "fastloop.Queue.close": "queue.Queue.shutdown's spelling",
}

BAD_WORKER_NAMES = {"tag", "workers", "threads", "copy_threads", "num_procs", "processes"}
DURATION_WORDS = ("timeout", "interval", "delay", "ttl", "wait", "every", "drain", "poll", "keep_alive",
                  "visibility", "age", "period", "deadline", "sleep", "linger", "grace", "backoff", "duration")
# Names that contain a duration word but hold no duration.
NOT_DURATIONS = {
    "every_steps",  # a count of steps (Checkpointer), beside every_s
    "wait",  # a flag, never a duration (a close(wait=) is caught by the closing rule)
    "deadline",  # a point in time (time.time()), as JobRecord's submitted and finished ("Time")
}
TORCH_LOADER_NAMES = {"workers": "num_workers", "prefetch": "prefetch_factor", "prefetch_batches": "prefetch_factor",
                      "prefetch_depth": "prefetch_factor", "persistent": "persistent_workers",
                      "pin": "pin_memory", "collate": "collate_fn", "drop_last_batch": "drop_last"}
PAYLOAD_NAMES = {"value", "values", "state", "image", "text", "payload", "data", "inputs", "item"}


def public_modules() -> list[Any]:
    found = []
    for name in MODULES:
        try:
            found.append(importlib.import_module(name))
        except ImportError:  # an optional part (serve's extras, a build without CUDA)
            continue
    return found


def signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # a C function without a text signature
        return None


def public_callables() -> Iterator[tuple[str, Callable[..., Any]]]:
    """(qualified name, callable) for every public function, class constructor and public
    method of what the public modules export in __all__ (each object once)."""
    seen: set[int] = set()
    for module in public_modules():
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name, None)
            if obj is None or id(obj) in seen or inspect.ismodule(obj):
                continue
            seen.add(id(obj))
            where = f"{module.__name__}.{name}"
            if inspect.isclass(obj):
                if issubclass(obj, BaseException):
                    continue
                yield where, obj  # the constructor's signature
                for attr, member in vars_of(obj):
                    yield f"{where}.{attr}", member
            elif callable(obj):
                yield where, obj


def vars_of(cls: type) -> Iterator[tuple[str, Any]]:
    for klass in cls.__mro__:
        if klass is object or klass.__module__ == "builtins" or klass.__module__.startswith("typing"):
            continue
        for attr, member in vars(klass).items():
            if attr.startswith("_"):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if callable(member) and not inspect.isclass(member):
                yield attr, getattr(cls, attr, member)


def params(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    sig = signature(fn)
    if sig is None:
        return []
    return [p for p in sig.parameters.values() if p.name not in ("self", "cls")
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


CALLABLES = sorted(dict(public_callables()).items())


def violations(rule: Callable[[str, Callable[..., Any]], list[str]]) -> str:
    """Every problem of `rule` not in ALLOWED, one a line (empty when none)."""
    found = []
    for where, fn in CALLABLES:
        for problem in rule(where, fn):
            key = problem.split(":")[0]
            if key not in ALLOWED and key.split("(")[0] not in ALLOWED:
                found.append(problem)
    return "\n".join(found)


def test_the_public_api_is_found():
    names = {where for where, _ in CALLABLES}
    assert {"fastloop.Monitor.scalar", "fastloop.Checkpointer.maybe_save", "fastloop.Loader"} <= names


def worker_and_tag_names(where: str, fn: Callable[..., Any]) -> list[str]:
    problems = []
    for p in params(fn):
        if p.name == "tag":
            problems.append(f"{where}(tag): a series, metric or event is a 'name'")
        elif p.name in BAD_WORKER_NAMES:
            problems.append(f"{where}({p.name}): threads or processes beside the caller are 'num_workers'; "
                            f"threads inside one call are 'num_threads'")
        elif re.search(r"_(threads|workers)$", p.name) and p.name not in ("num_workers", "num_threads",
                                                                           "persistent_workers"):
            problems.append(f"{where}({p.name}): worker counts are 'num_workers' (beside the caller) "
                            f"or 'num_threads' (inside one call)")
    return problems


def test_no_tag_and_one_name_for_worker_counts():
    assert violations(worker_and_tag_names) == ""


def duration_names(where: str, fn: Callable[..., Any]) -> list[str]:
    problems = []
    for p in params(fn):
        name = p.name
        if name.endswith("_ms"):
            problems.append(f"{where}({name}): durations are in seconds, named '..._s'")
        elif any(re.search(rf"(^|_){word}(_|$)", name) for word in DURATION_WORDS) and name != "timeout" \
                and not name.endswith("_s") and name not in NOT_DURATIONS:
            problems.append(f"{where}({name}): a duration is 'timeout' or ends in '_s'")
    return problems


def test_every_duration_is_timeout_or_ends_in_s():
    assert violations(duration_names) == ""


def close_parameters(where: str, fn: Callable[..., Any]) -> list[str]:
    if not where.endswith(".close"):
        return []
    extra = [p.name for p in params(fn) if p.name != "timeout"]
    return [f"{where}({', '.join(extra)}): close() takes only 'timeout'"] if extra else []


def test_close_takes_only_timeout():
    assert violations(close_parameters) == ""


def stats_annotation(where: str, fn: Callable[..., Any]) -> list[str]:
    if not where.endswith(".stats"):
        return []
    sig = signature(fn)
    if sig is None:
        return [f"{where}: no signature to read its return annotation"]
    annotation = sig.return_annotation
    if isinstance(annotation, str):
        try:
            annotation = typing.get_type_hints(fn).get("return", annotation)
        except Exception:  # an annotation that does not evaluate: compare its text
            pass
    if annotation == dict[str, Any] or str(annotation).replace("typing.", "") in ("dict[str, Any]",):
        return []
    return [f"{where}: stats() must be annotated '-> dict[str, Any]', not {annotation!r}"]


def test_stats_return_dict_str_any():
    assert violations(stats_annotation) == ""


LONG_LIVED = ["fastloop.Loader", "fastloop.Monitor", "fastloop.Checkpointer", "fastloop.serve.InferenceService"]


def test_every_long_lived_object_has_stats():
    missing = []
    for where in LONG_LIVED:
        module, _, name = where.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if not callable(getattr(cls, "stats", None)):
            missing.append(f"{where}.stats: a long-lived object has stats() -> dict[str, Any]")
    assert "\n".join(missing) == ""


def step_before_value(where: str, fn: Callable[..., Any]) -> list[str]:
    names = [p.name for p in params(fn)]
    if "step" not in names:
        return []
    payload = [n for n in names if n in PAYLOAD_NAMES]
    if payload and names.index("step") < names.index(payload[0]):
        return [f"{where}(step): the step comes after the name and value ('{payload[0]}')"]
    return []


def test_the_step_comes_last():
    assert violations(step_before_value) == ""


def loader_keywords(where: str, fn: Callable[..., Any]) -> list[str]:
    if not re.search(r"\.(Loader|DataLoader)$", where):
        return []
    return [f"{where}({p.name}): torch's DataLoader calls it '{TORCH_LOADER_NAMES[p.name]}'"
            for p in params(fn) if p.name in TORCH_LOADER_NAMES]


def test_loader_keywords_are_torchs():
    assert violations(loader_keywords) == ""


def test_the_loader_has_torchs_worker_keywords():
    import fastloop

    names = {p.name for p in params(fastloop.Loader)}
    missing = {"num_workers", "prefetch_factor"} - names
    assert not missing, f"fastloop.Loader: missing torch's keyword(s) {sorted(missing)}"


def test_the_checkers_catch_each_kind_of_inconsistency():
    """Each rule fails on a made-up signature breaking it (so a rule that silently matches
    nothing is caught)."""

    class Bad:
        def __init__(self, workers: int = 0, copy_threads: int = 1, poll_ms: int = 5, interval: float = 1.0) -> None: ...
        def event(self, name: str, step: int = 0, value: float = 0.0) -> None: ...
        def histogram(self, tag: str, values: Any) -> None: ...
        def close(self, wait: bool = True) -> None: ...
        def stats(self) -> dict[str, int]: ...

    assert [p.split(":")[0] for p in worker_and_tag_names("x.Bad", Bad)] == ["x.Bad(workers)", "x.Bad(copy_threads)"]
    assert [p.split(":")[0] for p in worker_and_tag_names("x.Bad.histogram", Bad.histogram)] == ["x.Bad.histogram(tag)"]
    assert [p.split(":")[0] for p in duration_names("x.Bad", Bad)] == ["x.Bad(poll_ms)", "x.Bad(interval)"]
    assert close_parameters("x.Bad.close", Bad.close)
    assert stats_annotation("x.Bad.stats", Bad.stats)
    assert step_before_value("x.Bad.event", Bad.event)
    assert loader_keywords("x.Loader", Bad)


DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "development.md"


def test_the_conventions_are_written_in_development_md():
    text = DOC.read_text()
    match = re.search(r"^## API conventions\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, "docs/development.md has no '## API conventions' section"
    section = match.group(1)
    for rule, words in {
        "order": ["**Order", "`Monitor.scalar(name, value, step)`", "maybe_save(state, step)"],
        "names": ["**Names.**", "`tag`", "`name`"],
        "worker counts": ["**Counts of workers.**", "`num_workers`", "`num_threads`"],
        "time": ["**Time.**", "`timeout`", "`_s`", "milliseconds"],
        "closing": ["**Closing.**", "`close(timeout=None)`", "Queue.close(immediate=False)"],
        "stats": ["**Stats.**", "stats() -> dict[str, Any]", "Monitor.attach(obj)"],
        "this test": ["tests/test_api_conventions.py"],
    }.items():
        for word in words:
            assert word in section, f"docs/development.md 'API conventions' does not state the {rule} rule ({word!r})"
