"""A small TOML writer for the drop-ins execgatectl writes whole (tomllib only reads).

Enough for what tomllib hands back of an engine's config: tables, strings, integers, floats,
booleans, dates and arrays (arrays of tables as inline tables). `loads(dump(d)) == d` is the
contract the unit tests hold it to.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from typing import Any

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def key(k: str) -> str:
    return k if _BARE.match(k) else json.dumps(k, ensure_ascii=False)


def value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{key(k)} = {value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def dump(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    _table(doc, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _table(t: dict[str, Any], path: list[str], lines: list[str]) -> None:
    subs = {k: v for k, v in t.items() if isinstance(v, dict)}
    scalars = {k: v for k, v in t.items() if k not in subs}
    if path and (scalars or not subs):
        lines.append("")
        lines.append("[" + ".".join(key(p) for p in path) + "]")
    lines.extend(f"{key(k)} = {value(v)}" for k, v in scalars.items())
    for k, v in subs.items():
        _table(v, [*path, k], lines)
