"""Converting SDK settings (``client.producer(topic, linger="5ms")``) to their declared types.

Shared by the producer, consumer and push-consumer configs, so every SDK setting
accepts the same spellings: durations as ``timedelta``, seconds or ``"250ms"``;
sizes as ints or ``"64MiB"``; booleans as ``True``/``"true"``/``"1"``. A bool is
never silently an int. Errors name the owner and the setting.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sluice.common.units import parse_duration, parse_size
from sluice.errors import InvalidArgument

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def convert_setting(owner: str, name: str, tp: Any, raw: Any) -> Any:
    """``raw`` as type ``tp`` (timedelta, bool, int or str); other types pass through."""
    try:
        if tp is timedelta:
            if isinstance(raw, bool):
                raise TypeError
            return parse_duration(raw)
        if tp is bool:
            if isinstance(raw, bool):
                return raw
            text = raw.lower() if isinstance(raw, str) else None
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise TypeError
        if tp is int:
            if isinstance(raw, bool | float):
                raise TypeError
            return parse_size(raw) if isinstance(raw, str) else int(raw)
        if tp is str:
            if not isinstance(raw, str):
                raise TypeError
            return raw
    except InvalidArgument as exc:
        raise InvalidArgument(f"{owner} setting {name}: {exc.message}") from None
    except (TypeError, ValueError):
        type_name = getattr(tp, "__name__", str(tp))
        raise InvalidArgument(f"{owner} setting {name}: {raw!r} is not a valid {type_name}") from None
    return raw
